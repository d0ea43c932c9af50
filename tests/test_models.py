import ast
import json
import sys

import pytest

from reproci import errors, verdicts
from reproci.errors import ModelError
from reproci.settings import models
from reproci.settings.models import resolve, resolve_all
from reproci.worker import contract

from .helpers import PLUGINS, ROOT, Cli, model_entry


def test_reference_models_resolve_to_their_source_files():
    m = resolve("conv")
    assert m.source.name == "conv.py" and not m.plugin
    assert len(m.code_sha256) == 64


def test_file_plugin_resolves_with_absolute_path():
    m = resolve(f"{PLUGINS / 'faulty.py'}:clock_seed")
    assert m.plugin and m.name == "faulty.clock_seed" and m.ref.endswith("faulty.py:clock_seed")


def test_module_plugin_resolves():
    m = resolve("reproci.reference_models.embedding:build")
    assert m.plugin and m.name == "embedding"


@pytest.mark.parametrize("text", ["resnet", "x.py", "missing/file.py:build", "no_such_module_xyz:build", "a.py:1bad"])
def test_bad_references_are_refused(text):
    with pytest.raises(ModelError):
        resolve(text)


def test_the_reference_models_old_module_name_says_their_new_one():
    """reproci's reference models moved under ``reproci`` (a user's own ``reference_models`` wins)."""
    with pytest.raises(ModelError, match=r"reproci.reference_models.embedding:build now"):
        resolve("reference_models.embedding:build")


def test_a_factory_the_plugin_never_defines_is_refused_before_any_run(cli, tmp_path, monkeypatch):
    """It used to be found by the first run, 13 s in (exit 4): now by reading the file's syntax
    (nothing imported, so no torch), at once (exit 2)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("import torch\n\ndef build(ctx):\n    def nosuch():\n        pass\n\n"
                                      "class Net:\n    nosuch = 1\n\ndef helper():\n    pass\n")
    code, _, err = cli("run", "-m", "mine.py:nosuch")
    assert code == errors.EXIT_USAGE, err
    assert err == ("error: mine.py defines no 'nosuch' at its top level (from --model mine.py:nosuch; its top-level "
                   "functions: build, helper); name the factory after the colon")
    assert not (tmp_path / "results").exists()
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = cli("run", "-m", "mine:nosuch")  # a module's source is read the same way
    assert code == errors.EXIT_USAGE and "mine.py defines no 'nosuch' at its top level" in err


def test_a_factory_that_is_not_callable_is_refused_before_any_run(cli, tmp_path, monkeypatch):
    """``build = 3`` used to be found by run A, after the launch ('has no callable'): now by
    reading the file, at once, in one line (exit 2), nothing written; the module form too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("import torch\n\nbuild = 3\nif torch:\n    build = [1, 2]\n")
    code, out, err = cli("run", "-m", "mine.py:build")
    assert code == errors.EXIT_USAGE and out == "", err
    assert err == ("error: mine.py: 'build' is 3 or a list, not a function (from --model mine.py:build); name the "
                   "factory, the function that takes a ModelContext and returns a TrainSetup, after the colon")
    assert not (tmp_path / "results").exists()
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = cli("run", "-m", "mine:build")
    assert code == errors.EXIT_USAGE and "'build' is 3 or a list, not a function" in err, err


@pytest.mark.parametrize("source, kind", [
    ("build = 3", "3"), ("build: int = 3", "3"), ("build = 'x' * 1", None), ("build = {}", "a dict"),
    ("build = (1, 2)", "a tuple"), ("build = [f(x) for x in y]", "a list"), ("build = f'{x}'", "a string"),
    ("build = None\ndef f():\n    build = g", "None"), ("build = 3\nbuild = make", None),
    ("build = 3\nwith a as build: pass", None), ("build = 3\n(build := make)", None),
])
def test_what_a_factory_that_cannot_be_called_is(source, kind):
    assert models._not_callable(ast.parse(source), "build") == kind


@pytest.mark.parametrize("source", [
    "def build(ctx): pass", "async def build(ctx): pass", "class build: pass", "build = make",
    "build: object = make", "if x:\n    build = a\nelse:\n    build = b", "try:\n    from m import build\nexcept ImportError:\n    pass",
    "from m import make as build", "import build", "import build.sub", "from m import *", "for build in []: pass",
    "with a as build: pass", "(build := make)", "def f():\n    global build\n    build = g",
    "globals()['build'] = make", "setattr(sys.modules[__name__], 'build', make)", "def __getattr__(name): pass",
    "@register\ndef make(ctx): pass\nbuild = make",
])
def test_what_may_define_a_factory_is_taken_as_defining_it(source):
    assert models._may_define(ast.parse(source), "build")
    assert models._not_callable(ast.parse(f"build = 3\n{source}"), "build") is None  # nor taken for a literal


@pytest.mark.parametrize("source", [
    "def make(ctx): pass", "def f():\n    build = 1", "class C:\n    build = 1", "class C:\n    def build(self): pass",
    "x = build", "import m.build", "from build import make", "print(build)", "lambda build: build",
])
def test_what_cannot_define_a_factory_is_not_taken_for_it(source):
    assert not models._may_define(ast.parse(source), "build")


@pytest.mark.parametrize("stem", ["..", "."])
def test_a_plugin_whose_name_cannot_name_a_folder_is_refused(stem, tmp_path):
    """A model's runs write under results/RUN/NAME/: a plugin file named '...py' would be '..'."""
    plugin = tmp_path / f"{stem}.py"
    plugin.write_text("def build(ctx):\n    pass\n")
    with pytest.raises(ModelError, match="cannot name a folder"):
        resolve_all((f"{plugin}:build",))


def test_duplicate_names_are_refused():
    with pytest.raises(ModelError, match="both named"):
        resolve_all(("embedding", "reproci.reference_models.embedding:build"))


# --- a missing optional library: one line that says what to install ---------------------------

NOT_INSTALLED = """\
import sys
for name in {names!r}:
    sys.modules[name] = None  # as if not installed: find_spec gives None, import raises ModuleNotFoundError
"""
USES_HF = """\
from reproci.adapters.hf import hf_setup

def build(ctx):
    return hf_setup(ctx, None, train_dataset=[])
"""
LAZY_LIGHTNING = """\
def build(ctx):
    from reproci.adapters.lightning import lightning_setup
    return lightning_setup(ctx, None)
"""


@pytest.mark.slow
def test_a_missing_library_is_one_contract_line_that_says_what_to_install(tmp_path) -> None:
    """transformers and Lightning not installed (the worker's imports of them fail as they would):
    a plugin that imports an adapter, an example that imports its library and a factory that
    imports an adapter when it runs each end in one line naming the package, who imports it and
    the extra to install, as a contract ERROR (exit 4), with no traceback."""
    site, plugins = tmp_path / "site", tmp_path / "plugins"
    site.mkdir()
    plugins.mkdir()
    (site / "sitecustomize.py").write_text(NOT_INSTALLED.format(names=("transformers", "pytorch_lightning", "lightning")))
    (plugins / "uses_hf.py").write_text(USES_HF)
    (plugins / "lazy_lightning.py").write_text(LAZY_LIGHTNING)
    cli = Cli(tmp_path)
    out = cli("run", "-m", f"{plugins / 'uses_hf.py'}:build", "-m", f"{ROOT / 'examples' / 'lightning_regressor.py'}:build",
              "-m", f"{plugins / 'lazy_lightning.py'}:build", "--steps", "4", "--resume-at", "2",
              env={"PYTHONPATH": f"{ROOT}:{site}"})
    assert out.returncode == errors.EXIT_RUN_ERROR, out.stdout + out.stderr
    expected = {
        "uses_hf": "model 'uses_hf' needs the package 'transformers' (reproci.adapters.hf imports it): "
                   "pip install 'reproci[hf]'",
        "lightning_regressor": "model 'lightning_regressor' needs the package 'pytorch-lightning' "
                               "(lightning_regressor.py imports it): pip install 'reproci[lightning]'",
        "lazy_lightning": "model 'lazy_lightning' needs the package 'pytorch-lightning' "
                          "(reproci.adapters.lightning imports it): pip install 'reproci[lightning]'",
    }
    doc = cli.latest()
    for name, line in expected.items():
        entry = model_entry(doc, name)
        assert entry["verdict"] == verdicts.ERROR and entry["error"]["kind"] == "contract", entry
        assert entry["message"].endswith(line) and "\n" not in entry["message"], entry["message"]
        record = json.loads(next((tmp_path / "results" / doc["run_id"] / name).glob("record-*.json")).read_text())
        assert record["error_kind"] == "contract" and record["message"].endswith(line)
    assert "Traceback" not in out.stdout + out.stderr


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001 - its traceback is the point
        return e


def test_only_a_library_that_is_not_there_counts_as_missing(monkeypatch) -> None:
    """An installed library that lacks a name (an API of another version), a package the map does
    not know, and a message asking for a library that is installed (too old, say) are left as
    they are; a library asked for that is not installed counts, as does one under a wrapper."""
    assert contract.missing_package(_raised(ImportError("cannot import name 'Nope' from 'transformers'",
                                                        name="transformers"))) is None
    assert contract.missing_package(_raised(ModuleNotFoundError("No module named 'wandb'", name="wandb"))) is None
    assert contract.missing_package(_raised(ModuleNotFoundError("No module named 'torch.nope'", name="torch.nope"))) is None
    monkeypatch.setitem(contract.OPTIONAL_PACKAGES, "numpy", ("numpy", "hf"))  # installed wherever torch runs
    assert contract.missing_package(_raised(ImportError("X requires `numpy>=99`: pip install 'numpy>=99'"))) is None
    monkeypatch.setitem(sys.modules, "reproci_absent_probe", None)  # as if not installed
    monkeypatch.setitem(contract.OPTIONAL_PACKAGES, "reproci_absent_probe", ("reproci-absent-probe", "hf"))
    found = contract.missing_package(_raised(ImportError("X requires `reproci-absent-probe>=1`: pip install it")))
    assert found is not None and found[0] == "reproci_absent_probe" and found[2] == "requires"
    outer = ModuleNotFoundError("Could not import module 'GPT2LMHeadModel'")
    outer.__cause__ = _raised(ModuleNotFoundError("No module named 'accelerate'", name="accelerate"))
    assert contract.missing_package(outer)[0] == "accelerate"  # type: ignore[index]  # transformers' lazy import wraps it


def test_in_a_container_the_image_must_have_it(monkeypatch) -> None:
    assert contract.install_hint("accelerate") == "pip install 'reproci[hf]'"
    assert contract.install_hint("lightning") == "pip install lightning"
    monkeypatch.setattr(contract, "__file__", "/reproci/code/reproci/worker/contract.py")
    assert contract.install_hint("accelerate") == "install transformers, accelerate in the image"


def test_each_extra_installs_what_the_message_names_and_is_pinned_for_tests() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {line.split("==")[0] for line in (ROOT / "constraints-dev.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    for extra, names in contract.EXTRAS.items():
        dists = {req.split(">")[0].split("<")[0].split("=")[0].strip() for req in extras[extra]}
        assert dists == set(names.split(", ")), (extra, dists)
        assert dists <= pins, dists - pins
    for module, (_dist, extra) in contract.OPTIONAL_PACKAGES.items():
        assert extra is None or extra in contract.EXTRAS, module
    for example, extra in (("hf_gpt2.py", "hf"), ("lightning_regressor.py", "lightning")):
        assert f"pip install 'reproci[{extra}]'" in (ROOT / "examples" / example).read_text(), example
