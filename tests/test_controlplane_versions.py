"""The local plane at each supported Kubernetes minor (docs/versions.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kubernetes import client, config

from gpuclaimctl.controlplane import ControlPlane, ControlPlaneError, build
from gpuclaimctl.controlplane import plane as plane_module

GOMOD = Path(build.__file__).resolve().parent / "gomod"


@pytest.mark.parametrize("value, minor", [
    ("1.35", "1.35"), ("v1.36", "1.36"), ("v1.35.4", "1.35"), ("1.36.3", "1.36"),
    ("", build.NEWEST_MINOR), (" 1.37 ", "1.37"),
])
def test_a_minor_is_named_by_its_number_or_its_pinned_release(value: str, minor: str) -> None:
    assert build.selected_minor(value) == minor


@pytest.mark.parametrize("value", ["1.34", "1.38", "1.35.1", "v1.36.9", "latest", "1"])
def test_an_unsupported_version_is_refused_with_the_choices(value: str) -> None:
    with pytest.raises(build.BuildError) as e:
        build.selected_minor(value)
    assert str(e.value) == (f"Kubernetes {value!r} is not a supported version; choose one of "
                            "1.35 (v1.35.4), 1.36 (v1.36.3), 1.37 (v1.37.2)")


def test_the_environment_names_the_minor_when_no_value_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(build.VERSION_ENV, "1.36")
    assert build.selected_minor() == "1.36"
    assert build.selected_minor("1.35") == "1.35", "an explicit value wins"
    monkeypatch.delenv(build.VERSION_ENV)
    assert build.selected_minor() == build.NEWEST_MINOR


def fake_cache(root: Path, components: tuple[build.Component, ...]) -> None:
    for component in components:
        d = build.component_dir(component, root)
        d.mkdir(parents=True, exist_ok=True)
        for b in component.binaries:
            (d / b).write_text("")


@pytest.mark.parametrize("minor", ["1.35", "1.36"])
def test_an_older_minor_builds_its_server_binaries_into_its_own_folder_and_shares_the_rest(
    tmp_path: Path, minor: str,
) -> None:
    root = tmp_path / "cache"
    fake_cache(root, build.COMPONENTS)  # the newest's, as `make test` leaves them
    components = build.plane_components(minor)
    older = build.kubernetes_component(minor)
    assert build.missing(root, components) == [older]
    assert older.binaries == ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
    fake_cache(root, (older,))
    messages: list[str] = []
    paths = build.ensure_binaries(root, log=messages.append, components=components)
    assert messages == []
    pinned = build.KUBERNETES_VERSIONS[minor]
    plane_dir = root / "controlplane"
    assert paths == {
        "etcd": plane_dir / "etcd-v3.7.0" / "etcd",
        "kube-apiserver": plane_dir / f"kubernetes-{pinned}" / "kube-apiserver",
        "kube-scheduler": plane_dir / f"kubernetes-{pinned}" / "kube-scheduler",
        "kube-controller-manager": plane_dir / f"kubernetes-{pinned}" / "kube-controller-manager",
        "kubectl": plane_dir / "kubernetes-v1.37.2" / "kubectl",
        "kwok": plane_dir / "kwok-v0.8.0" / "kwok",
    }


def test_the_newest_keeps_its_cache_folder_and_its_four_binaries() -> None:
    assert build.plane_components(build.NEWEST_MINOR) == build.PLANE_COMPONENTS
    assert build.kubernetes_component("1.37").key == "kubernetes-v1.37.2"
    assert "kubectl" in build.kubernetes_component("1.37").binaries


@pytest.mark.parametrize("minor", sorted(build.KUBERNETES_VERSIONS))
def test_each_minor_is_pinned_by_a_go_module_of_its_release(minor: str) -> None:
    """go.mod requires the pinned k8s.io/kubernetes and replaces every staging
    module with the v0.X.Y of the same release; a mixed release does not build."""
    component = build.kubernetes_component(minor)
    gomod = (GOMOD / component.gomod / "go.mod").read_text()
    pinned = build.KUBERNETES_VERSIONS[minor]
    assert f"require k8s.io/kubernetes {pinned}\n" in gomod
    staging = "v0." + pinned.removeprefix("v1.")
    replaces = re.findall(r"^\t(k8s\.io/\S+) => (\S+) (\S+)$", gomod, re.M)
    assert len(replaces) >= 30
    assert {(a, b, v) for a, b, v in replaces if a != b or v != staging} == set()
    assert (GOMOD / component.gomod / "go.sum").stat().st_size > 0


def test_an_older_build_is_stamped_with_its_release_and_the_newests_recipe_is_unchanged() -> None:
    flags = build._kubernetes_ldflags(build.kubernetes_component("1.35"))
    assert "-X k8s.io/component-base/version.gitVersion=v1.35.4" in flags
    assert "-X k8s.io/component-base/version.gitMinor=35" in flags
    assert "-X k8s.io/client-go/pkg/version.gitMajor=1" in flags
    assert build._kubernetes_ldflags(build.KUBERNETES) == ()


# -- a kept plane across minors --------------------------------------------------------------


def kept_plane(workdir: Path, minor: str) -> ControlPlane:
    return ControlPlane(workdir, version=minor, audit=False)


@pytest.mark.parametrize("last, now, says", [
    pytest.param("1.37", "1.36", "Kubernetes does not go back a minor version", id="back-one"),
    pytest.param("1.36", "1.35", "Kubernetes does not go back a minor version", id="back-from-1.36"),
    pytest.param("1.35", "1.37", "upgrades one minor version at a time: run it with 1.36 once first",
                 id="skip-one"),
    pytest.param(None, "1.35", "does not go back", id="unrecorded-is-1.37"),
])
def test_a_kept_plane_refuses_a_minor_it_cannot_go_to_before_building_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, last: str | None, now: str, says: str,
) -> None:
    monkeypatch.setenv("GPUCLAIMCTL_CACHE", str(tmp_path / "empty-cache"))  # a build would fail
    workdir = tmp_path / "kept"
    (workdir / "etcd" / "member").mkdir(parents=True)
    if last is not None:
        (workdir / plane_module.VERSION_FILE).write_text(last + "\n")
    with pytest.raises(ControlPlaneError) as e:
        kept_plane(workdir, now).start()
    assert says in str(e.value)
    assert f"was last run by Kubernetes {last or '1.37'}, not {now}" in str(e.value)
    assert not (tmp_path / "empty-cache").exists(), "refused before any build"


@pytest.mark.plane
def test_a_kept_plane_goes_up_one_minor_and_never_back(tmp_path: Path) -> None:
    """On the session's minor (GPUCLAIMCTL_K8S_VERSION): a kept plane made
    there keeps its objects through the next minor's start, and refuses to
    go back, or to skip a minor, as kubeadm does for a real cluster."""
    minor = build.selected_minor()
    workdir = tmp_path / "kept"
    with kept_plane(workdir, minor) as first:
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(first.kubeconfig)))
        core.create_namespaced_config_map("default", {"metadata": {"name": "kept"},
                                                      "data": {"made-on": minor}})
    assert (workdir / plane_module.VERSION_FILE).read_text() == minor + "\n"
    number = int(minor.split(".")[1])
    newest = int(build.NEWEST_MINOR.split(".")[1])
    if number == newest:
        with pytest.raises(ControlPlaneError, match="does not go back a minor version"):
            kept_plane(workdir, f"1.{number - 1}").start()
        return
    if number + 1 < newest:
        with pytest.raises(ControlPlaneError, match=f"run it with 1.{number + 1} once first"):
            kept_plane(workdir, build.NEWEST_MINOR).start()
        return
    with kept_plane(workdir, f"1.{number + 1}") as upgraded:
        assert upgraded.resumed
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(upgraded.kubeconfig)))
        assert core.read_namespaced_config_map("kept", "default").data == {"made-on": minor}
        assert client.VersionApi(core.api_client).get_code().minor == str(number + 1)
    assert (workdir / plane_module.VERSION_FILE).read_text() == f"1.{number + 1}\n"
    with pytest.raises(ControlPlaneError, match="does not go back a minor version"):
        kept_plane(workdir, minor).start()
