"""DeviceClass selectors in gpuclaimctl's CEL subset (model/dracel.py):
what matches, what is the error kube-scheduler would hit too, what is
refused as outside the subset."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpuclaimctl.model.celvalues import Semver, parse_quantity_exact, parse_semver
from gpuclaimctl.model.dracel import BadValue, CelDevice, EvalError, compile_selector, qualify

NV = "gpu.nvidia.com"

DEVICE = CelDevice(
    driver=NV,
    attributes={
        (NV, "type"): "gpu",
        (NV, "productName"): "NVIDIA A100-SXM4-80GB",
        (NV, "index"): 3,
        (NV, "mig"): False,
        (NV, "driverVersion"): parse_semver("550.54.15"),
        ("resource.kubernetes.io", "pcieRoot"): "pci0000:00",
        (NV, "ids"): (1, 2, 3),
    },
    capacity={(NV, "memory"): parse_quantity_exact("80Gi")},
)


def evaluate(expression: str, device: CelDevice = DEVICE) -> bool | EvalError:
    selector = compile_selector(expression)
    assert selector.supported, selector.unsupported
    return selector.matches(device)


@pytest.mark.parametrize(("expression", "want"), [
    pytest.param('device.driver == "gpu.nvidia.com"', True, id="driver"),
    pytest.param("device.driver == 'gpu.intel.com'", False, id="other-driver"),
    pytest.param("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
                 True, id="nvidia-gpu-class"),
    pytest.param("device.attributes['gpu.nvidia.com'].type == 'mig'", False, id="mig-class-on-a-gpu"),
    pytest.param('device.attributes["gpu.nvidia.com"]["type"] == "gpu"', True, id="index-syntax"),
    pytest.param('device.attributes["gpu.nvidia.com"].type != "gpu"', False, id="not-equal"),
    pytest.param('device.attributes["gpu.nvidia.com"].index >= 3', True, id="int-ge"),
    pytest.param('device.attributes["gpu.nvidia.com"].index < 3', False, id="int-lt"),
    pytest.param('device.attributes["gpu.nvidia.com"].index <= 3 && device.attributes["gpu.nvidia.com"].index > 2',
                 True, id="int-range"),
    pytest.param('device.attributes["gpu.nvidia.com"].index == -1', False, id="negative-literal"),
    pytest.param('device.attributes["gpu.nvidia.com"].index == 0x3', True, id="hex-literal"),
    pytest.param('device.attributes["gpu.nvidia.com"].mig == false', True, id="bool"),
    pytest.param('!device.attributes["gpu.nvidia.com"].mig', True, id="negation"),
    pytest.param('"b" > "a" && "gpu" < "gpx"', True, id="string-order"),
    pytest.param('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A100")', True,
                 id="startsWith"),
    pytest.param('device.attributes["gpu.nvidia.com"].productName.endsWith("80GB")', True, id="endsWith"),
    pytest.param('device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100")', True,
                 id="lowerAscii-contains"),
    pytest.param('device.attributes["gpu.nvidia.com"].index in [1, 2, 3]', True, id="in-list"),
    pytest.param('device.attributes["gpu.nvidia.com"].type in ["mig", "vgpu"]', False, id="not-in-list"),
    pytest.param('2 in device.attributes["gpu.nvidia.com"].ids', True, id="in-list-attribute"),
    pytest.param('"type" in device.attributes["gpu.nvidia.com"]', True, id="key-in-domain"),
    pytest.param('"uuid" in device.attributes["gpu.nvidia.com"]', False, id="key-not-in-domain"),
    pytest.param('has(device.attributes["gpu.nvidia.com"].type)', True, id="has"),
    pytest.param('has(device.attributes["gpu.nvidia.com"].uuid)', False, id="has-not"),
    pytest.param('has(device.attributes["example.com"].type)', False, id="has-in-an-unknown-domain"),
    pytest.param('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))', True,
                 id="semver-greater"),
    pytest.param('device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("v550.54", true)) > 0', True,
                 id="semver-normalized"),
    pytest.param('device.attributes["gpu.nvidia.com"].driverVersion == semver("550.54.15+build.7")', True,
                 id="semver-equality-ignores-build"),
    pytest.param('device.attributes["gpu.nvidia.com"].driverVersion.major() == 550', True, id="semver-major"),
    pytest.param('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', True,
                 id="quantity-compareTo"),
    pytest.param('device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("85899345921"))', True,
                 id="quantity-exact"),
    pytest.param('device.capacity["gpu.nvidia.com"].memory == quantity("80Gi")', True, id="quantity-equal"),
    pytest.param('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"', True,
                 id="another-domain"),
    pytest.param('device.attributes["example.com"] == device.attributes["example.org"]', True,
                 id="unknown-domains-are-empty-maps"),
    pytest.param("device.allowMultipleAllocations == false", True, id="allowMultipleAllocations"),
    pytest.param("(true || false) && !(false)", True, id="parentheses"),
    pytest.param('"x" == 1', False, id="different-types-are-unequal"),
])
def test_selector_evaluates_as_the_scheduler_does(expression: str, want: bool) -> None:
    assert evaluate(expression) is want


@pytest.mark.parametrize(("expression", "error"), [
    pytest.param('device.attributes["gpu.nvidia.com"].uuid == "x"', "no such key: uuid", id="missing-attribute"),
    pytest.param('device.attributes["example.com"].type == "gpu"', "no such key: type",
                 id="missing-attribute-in-an-unknown-domain"),
    pytest.param('device.attributes["gpu.nvidia.com"].driverVersion == "550.54.15"', "no such overload",
                 id="semver-compared-with-a-string"),
    pytest.param('device.attributes["gpu.nvidia.com"].driverVersion < semver("600.0.0")', "no such overload",
                 id="semver-has-no-less-than-operator"),
    pytest.param('device.attributes["gpu.nvidia.com"].index < "4"', "no such overload", id="int-vs-string-order"),
    pytest.param('device.attributes["gpu.nvidia.com"].type', "could not be converted to bool", id="not-a-bool"),
    pytest.param('semver("1.02.3") == semver("1.2.3")', "leading zeroes", id="strict-semver"),
    pytest.param('quantity("1.2.3") == quantity("1")', "quantities must match", id="bad-quantity"),
    pytest.param('device.attributes["gpu.nvidia.com"].uuid == "x" && true', "no such key", id="and-keeps-the-error"),
    pytest.param('device.attributes["gpu.nvidia.com"].uuid == "x" || false', "no such key", id="or-keeps-the-error"),
])
def test_runtime_errors_are_errors_not_false(expression: str, error: str) -> None:
    got = evaluate(expression)
    assert isinstance(got, EvalError) and not got.unsupported
    assert error in got.message


@pytest.mark.parametrize("expression", [
    pytest.param('device.attributes["gpu.nvidia.com"].uuid == "x" && false', id="false-and-error"),
    pytest.param('false && device.attributes["gpu.nvidia.com"].uuid == "x"', id="error-and-false"),
])
def test_and_absorbs_an_error_when_the_other_side_is_false(expression: str) -> None:
    assert evaluate(expression) is False


@pytest.mark.parametrize("expression", [
    pytest.param('device.attributes["gpu.nvidia.com"].uuid == "x" || true', id="error-or-true"),
    pytest.param('true || device.attributes["gpu.nvidia.com"].uuid == "x"', id="true-or-error"),
])
def test_or_absorbs_an_error_when_the_other_side_is_true(expression: str) -> None:
    assert evaluate(expression) is True


def test_a_device_with_an_unparsable_attribute_fails_every_selector() -> None:
    # DeviceMatches converts every attribute before it evaluates anything.
    device = CelDevice(NV, {(NV, "type"): "gpu", (NV, "v"): BadValue("attribute v: parse semantic version")}, {})
    got = evaluate('device.driver == "gpu.nvidia.com"', device)
    assert isinstance(got, EvalError) and "parse semantic version" in got.message


@pytest.mark.parametrize(("expression", "names"), [
    pytest.param('device.attributes["gpu.nvidia.com"].productName.matches("A100.*")', "matches()", id="regex"),
    pytest.param("device.attributes['gpu.nvidia.com'].index + 1 == 4", "arithmetic", id="arithmetic"),
    pytest.param("device.attributes['gpu.nvidia.com'].index == 1 ? true : false", "conditional", id="ternary"),
    pytest.param("cel.bind(a, device.attributes['gpu.nvidia.com'], a.index == 3)", "variable 'cel'",
                 id="cel-bind"),
    pytest.param("device.attributes['gpu.nvidia.com'].ids.exists(i, i == 2)", "exists()", id="macro"),
    pytest.param("device.attributes['gpu.nvidia.com'].ids.includes(2)", "includes()",
                 id="list-type-attributes-includes"),
    pytest.param("device.attributes['gpu.nvidia.com'].index == 3.0", "floating-point", id="double"),
    pytest.param("device.attributes['gpu.nvidia.com'].index == 3u", "unsigned", id="uint"),
    pytest.param("device.attributes['gpu.nvidia.com'].uuid == null", "'null'", id="null"),
    pytest.param("has(device.attributes.foo)", "has()", id="has-on-the-outer-map"),
    pytest.param("'gpu.nvidia.com' in device.attributes", "'in' on device.attributes", id="in-outer-map"),
    pytest.param("device.name == 'gpu-0'", "device.name", id="unknown-device-field"),
    pytest.param("device == device", "device used as a value", id="device-itself"),
    pytest.param("{'a': 1}['a'] == 1", "'{'", id="map-literal"),
    pytest.param("device.attributes['gpu.nvidia.com']?.type == 'gpu'", "optional", id="optional-select"),
    pytest.param("device.driver == '''x'''", "triple-quoted", id="triple-quoted-string"),
    pytest.param("device.driver ==", "end", id="truncated"),
])
def test_outside_the_subset_is_refused_naming_the_expression(expression: str, names: str) -> None:
    selector = compile_selector(expression)
    assert not selector.supported
    assert repr(expression) in selector.unsupported
    assert names in selector.unsupported


def test_string_literals_take_cel_escapes() -> None:
    assert evaluate(r'"a\"b\x41\u00e9\101" == "a\"bAéA" && r"a\n" != "a\n"') is True


def test_bare_attribute_names_get_the_driver_domain() -> None:
    assert qualify("type", NV) == (NV, "type")
    assert qualify("resource.kubernetes.io/pcieRoot", NV) == ("resource.kubernetes.io", "pcieRoot")


@pytest.mark.parametrize(("a", "b", "sign"), [
    pytest.param("1.0.0", "2.0.0", -1, id="major"),
    pytest.param("1.10.0", "1.9.0", 1, id="numeric-not-lexical"),
    pytest.param("1.0.0-alpha", "1.0.0", -1, id="prerelease-first"),
    pytest.param("1.0.0-alpha.1", "1.0.0-alpha.beta", -1, id="numeric-before-alphanumeric"),
    pytest.param("1.0.0-alpha", "1.0.0-alpha.1", -1, id="shorter-prerelease-first"),
    pytest.param("1.0.0-rc.2", "1.0.0-rc.10", -1, id="numeric-prerelease"),
    pytest.param("1.0.0+a", "1.0.0+b", 0, id="build-ignored"),
])
def test_semver_orders_as_blang_semver(a: str, b: str, sign: int) -> None:
    assert parse_semver(a).compare(parse_semver(b)) == sign


@pytest.mark.parametrize("text", ["1.0", "v1.0.0", "01.0.0", "1.0.0-", "1.0.0-01", "1.0.0+", "1.0.0-a_b", ""])
def test_semver_refuses_what_blang_semver_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_semver(text)


def test_semver_keeps_prerelease_and_build() -> None:
    v = parse_semver("1.2.3-rc.1+exp.sha")
    assert v == Semver(1, 2, 3, ("rc", 1), ("exp", "sha"))
    assert str(v) == "1.2.3-rc.1+exp.sha"


@pytest.mark.parametrize(("text", "value"), [
    ("80Gi", Fraction(80 * 2**30)), ("1.5", Fraction(3, 2)), ("500m", Fraction(1, 2)), ("1e3", Fraction(1000)),
    ("2k", Fraction(2000)), ("-1", Fraction(-1)), (".5", Fraction(1, 2)), ("1E", Fraction(10**18)),
])
def test_quantities_are_exact(text: str, value: Fraction) -> None:
    assert parse_quantity_exact(text).value == value
