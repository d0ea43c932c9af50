import pytest

from pipeline.errors import ModelError
from pipeline.models import resolve, resolve_all

from .helpers import PLUGINS


def test_reference_models_resolve_to_their_source_files():
    m = resolve("conv")
    assert m.source.name == "conv.py" and not m.plugin
    assert len(m.code_sha256) == 64


def test_file_plugin_resolves_with_absolute_path():
    m = resolve(f"{PLUGINS / 'faulty.py'}:clock_seed")
    assert m.plugin and m.name == "faulty.clock_seed" and m.ref.endswith("faulty.py:clock_seed")


def test_module_plugin_resolves():
    m = resolve("reference_models.embedding:build")
    assert m.plugin and m.name == "embedding"


@pytest.mark.parametrize("text", ["resnet", "x.py", "missing/file.py:build", "no_such_module_xyz:build", "a.py:1bad"])
def test_bad_references_are_refused(text):
    with pytest.raises(ModelError):
        resolve(text)


def test_duplicate_names_are_refused():
    with pytest.raises(ModelError, match="both named"):
        resolve_all(("embedding", "reference_models.embedding:build"))
