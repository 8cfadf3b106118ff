"""Where the controller and its tools find the cluster (client.kube.load_client):
as controller-runtime's GetConfig, --kubeconfig, else $KUBECONFIG, else the
in-cluster service account, else ~/.kube/config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuclaimctl.client import kube


def _kubeconfig(path: Path, server: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return path


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No $KUBECONFIG, an empty home, not in a pod."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_the_named_kubeconfig_wins_over_the_environment(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    named = _kubeconfig(nowhere / "named", "https://named.example:6443")
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(nowhere / "env", "https://env.example:6443")))
    assert kube.load_client(str(named), None).configuration.host == "https://named.example:6443"


def test_kubeconfig_from_the_environment_is_used_when_none_is_named(nowhere: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(nowhere / "env", "https://env.example:6443")))
    assert kube.load_client(None, None).configuration.host == "https://env.example:6443"


def test_the_home_kubeconfig_is_the_last_resort(nowhere: Path) -> None:
    _kubeconfig(nowhere / "home" / ".kube" / "config", "https://home.example:6443")
    assert kube.load_client(None, None).configuration.host == "https://home.example:6443"


def test_no_cluster_anywhere_is_one_clear_line(nowhere: Path) -> None:
    with pytest.raises(kube.ConfigError) as e:
        kube.load_client(None, None)
    assert "$KUBECONFIG" in str(e.value) and "--kubeconfig" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_broken_kubeconfig_from_the_environment_is_named_in_the_error(nowhere: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bad = nowhere / "bad"
    bad.write_text("{not yaml: [")
    monkeypatch.setenv("KUBECONFIG", str(bad))
    with pytest.raises(kube.ConfigError, match="cannot load .*bad"):
        kube.load_client(None, None)


@pytest.mark.parametrize("text", ["[]", "clusters: 7", "current-context: nope\ncontexts: []"])
def test_a_kubeconfig_of_the_wrong_shape_is_a_clear_error(nowhere: Path, text: str) -> None:
    bad = nowhere / "shape"
    bad.write_text(text)
    with pytest.raises(kube.ConfigError, match="cannot load"):
        kube.load_client(str(bad), None)
