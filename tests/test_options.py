import pytest

from reproci import errors
from reproci.plugins import build_options
from reproci.stages.throughput.options import ThroughputOptions


def cli(**kw):
    return kw


def test_defaults_are_the_reference_matrix_on_the_local_backend():
    o = build_options(cli(), env={})
    assert [m.name for m in o.models] == ["conv", "transformer", "embedding"]
    assert o.backend == "local" and o.image_name == "local"
    assert o.steps == 30 and o.resume_at == 15 and o.threads == 1
    assert o.ci is False


def test_ci_mode_comes_from_the_environment():
    assert build_options(cli(), env={"CI": "true"}).ci is True


@pytest.mark.parametrize("kw, fragment", [
    (dict(steps=10, resume_at=10), "N must exceed k"),
    (dict(steps=10, resume_at=0), "between 1 and"),
    (dict(stages=("speed",)), "unknown stage 'speed'"),
    (dict(models=("resnet",)), "unknown model 'resnet'"),
    (dict(models=("nowhere/x.py:build",)), "does not exist"),
    (dict(threads=0), "--threads"),
    (dict(fault="gremlins"), "unknown fault"),
    (dict(stages=("throughput",), update_golden=True), "add --stage determinism"),
    (dict(stages=("determinism",), probes_fail=True), "add --stage probes"),
    (dict(jobs=0), "--jobs"),
    (dict(timeout=-1), "--timeout must be positive"),
    (dict(device="tpu"), "unknown device"),
    (dict(time_budget=0.0), "--time-budget must be a positive number of seconds, as 15 (got 0)"),
    (dict(time_budget=float("nan")), "--time-budget must be a positive number of seconds"),
])
def test_bad_values_are_usage_errors(kw, fragment):
    with pytest.raises(errors.ReprociError) as e:
        build_options(cli(**kw), env={})
    assert fragment in str(e.value)
    assert e.value.return_code == errors.EXIT_USAGE


def test_the_time_budget_comes_from_the_command_line_over_the_config_file_over_its_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    def time_budget(**given):
        return build_options(cli(**given), env={}).of(ThroughputOptions).time_budget

    assert time_budget() == 15.0  # the quick profile's three models within 60 s on a GPU
    (tmp_path / "reproci.yaml").write_text("time_budget: 40\n")
    assert time_budget() == 40.0
    assert time_budget(time_budget=5.5) == 5.5
    (tmp_path / "reproci.yaml").write_text("time_budget: -1\n")
    with pytest.raises(errors.UsageError, match=r"^reproci.yaml: time_budget must be a positive number of seconds"):
        build_options(cli(), env={})


def test_config_file_is_merged_under_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("steps: 12\nthreads: 2\nmodels: [embedding]\n")
    o = build_options(cli(threads=1), env={})
    assert o.steps == 12 and o.resume_at == 6 and o.threads == 1
    assert [m.name for m in o.models] == ["embedding"]


def test_malformed_config_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("steps: 12\nmodels: [conv\n")
    with pytest.raises(errors.ConfigError, match=r"reproci.yaml line \d+: malformed YAML"):
        build_options(cli(), env={})


def test_unknown_config_key_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("stepz: 12\n")
    with pytest.raises(errors.ConfigError, match="unknown option"):
        build_options(cli(), env={})


def test_options_are_frozen():
    o = build_options(cli(), env={})
    with pytest.raises(AttributeError):
        o.steps = 3  # type: ignore[misc]


CPU_X = ("version: 1\nimages:\n  cpu-x:\n    tag: reproci/cpu-x:1\n    base: {image: base:1}\n"
         "    requirements: requirements/cpu-x.txt\n")


def test_golden_name_of_a_manifest_image_is_its_manifest_name(tmp_path, monkeypatch):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "manifest.yaml").write_text(CPU_X)
    monkeypatch.chdir(tmp_path)
    assert build_options(cli(image="reproci/cpu-x:1"), env={}).image_name == "cpu-x"
    assert build_options(cli(image="cpu-x"), env={}).image_name == "cpu-x"
    assert build_options(cli(image="cpu-x", image_name="mine"), env={}).image_name == "mine"
    assert build_options(cli(image="nvcr.io/nvidia/pytorch:24.05-py3"), env={}).image_name == "nvcr.io_nvidia_pytorch_24.05-py3"
    assert build_options(cli(image="repo@sha256:" + "a" * 64), env={}).image_name == "repo"


def test_golden_name_without_a_manifest_entry_is_a_file_safe_reference():
    from reproci.settings.options import golden_name

    assert golden_name("ghcr.io/team/img:2", None) == "ghcr.io_team_img_2"
    assert golden_name("repo@sha256:" + "a" * 64, None) == "repo"


def test_the_image_is_resolved_once_into_a_reference_and_its_entry(tmp_path, monkeypatch):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "manifest.yaml").write_text(CPU_X)
    monkeypatch.chdir(tmp_path)
    o = build_options(cli(image="cpu-x"), env={})
    assert o.backend == "docker" and o.image == "cpu-x" and o.image_reference == "reproci/cpu-x:1"
    assert o.image_entry is not None and o.image_entry.name == "cpu-x" and o.image_entry.gpu is False
    other = build_options(cli(image="team/img:1"), env={})
    assert other.image_reference == "team/img:1" and other.image_entry is None
    local = build_options(cli(), env={})
    assert local.image_reference is None and local.image_entry is None


def test_a_malformed_manifest_fails_when_the_options_are_made(tmp_path, monkeypatch):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "manifest.yaml").write_text("version: 1\nimages: [cpu-x\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(errors.ConfigError, match=r"manifest.yaml line \d+: malformed YAML"):
        build_options(cli(image="cpu-x", image_name="given"), env={})  # even with --image-name: the backend needs it


def test_image_local_means_the_local_backend_as_every_hint_says():
    o = build_options(cli(image="local"), env={})
    assert o.backend == "local" and o.image is None and o.image_name == "local"


@pytest.mark.parametrize("text, fragment", [
    ("steps: ten\n", "steps: expected an integer, got 'ten'"),
    ("threads: x\n", "threads: expected an integer, got 'x'"),
    ("timeout: abc\n", "timeout: expected a number of seconds, got 'abc'"),
    ("seed: foo\n", "seed: expected an integer, got 'foo'"),
    ("steps: true\n", "steps: expected an integer, got True"),
    ("models: [conv, 3]\n", "models: expected a model name or a list of them"),
    ("keep_checkpoints: maybe\n", "keep_checkpoints: expected true or false"),
    ("time_budget: soon\n", "time_budget: expected a number of seconds, got 'soon'"),
])
def test_wrong_value_types_in_the_config_name_file_key_and_type(tmp_path, monkeypatch, text, fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text(text)
    with pytest.raises(errors.ConfigError, match="reproci.yaml: " + fragment.replace("[", r"\[")) as e:
        build_options(cli(), env={})
    assert e.value.return_code == errors.EXIT_USAGE and "\n" not in str(e.value)


def test_internal_and_test_only_keys_are_not_config_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for key in ("fault: clock-seed", "project_root: /", "github_actions: true", "step_summary: x", "config_file: y"):
        (tmp_path / "reproci.yaml").write_text(key + "\n")
        with pytest.raises(errors.ConfigError, match="unknown option") as e:
            build_options(cli(), env={})
        known = str(e.value).split("known: ")[1]
        assert not {"fault", "project_root", "github_actions", "step_summary", "config_file"} & set(known.split(", "))


def test_model_key_is_a_synonym_of_models(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("model: embedding\n")
    assert [m.name for m in build_options(cli(), env={}).models] == ["embedding"]


def test_gpus_without_an_image_is_a_usage_error_that_names_the_alternative():
    with pytest.raises(errors.UsageError, match="set CUDA_VISIBLE_DEVICES instead"):
        build_options(cli(gpus="2"), env={})


def test_a_missing_model_module_says_what_to_do():
    with pytest.raises(errors.ModelError, match="add its folder to PYTHONPATH, or give the file as path/to/file.py"):
        build_options(cli(models=("nosuchmodule.sub:build",)), env={})


def test_a_compile_mode_equal_to_the_default_is_accepted_without_compile(tmp_path, monkeypatch):
    assert build_options(cli(compile_mode="default"), env={}).compile_mode is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("compile_mode: default\n")
    o = build_options(cli(), env={})
    assert o.compiled == () and o.compile_mode is None


@pytest.mark.parametrize("text, kw, said", [
    ("steps: 1\n", {}, "reproci.yaml: steps must be at least 2 (got 1)"),
    ("steps: 1\n", {"steps": 1}, "--steps must be at least 2 (got 1)"),  # the command line wins, and is named
    ("stages: [speed]\n", {}, "reproci.yaml: unknown stage 'speed'"),
    ("threads: 0\n", {}, "reproci.yaml: threads must be at least 1"),
    ("", {"threads": 20000}, "--threads 20000 is more than 1024 intra-op threads a run"),
    ("", {"image_name": "../cpu"}, "--image-name '../cpu' names a golden file: use a name without slashes"),
    ("image_name: .hidden\n", {}, "reproci.yaml: image_name '.hidden' names a golden file"),
    ("seed: -3\n", {}, "reproci.yaml: seed -3 is out of range"),
    ("resume_at: 40\n", {}, "reproci.yaml: resume_at must be between 1 and steps-1 = 29 (got 40)"),
    ("compile: true\n", {"compile_mode": "max-autotune", "compile_": None}, None),  # the file's compile counts
    ("compile_mode: max-autotune\n", {},
     "reproci.yaml: compile_mode sets how torch.compile compiles: add compile: true (or --compile)"),
    ("", {"compile_mode": "max-autotune"}, "--compile-mode sets how torch.compile compiles: add --compile"),
])
def test_an_error_names_the_setting_as_the_user_wrote_it(tmp_path, monkeypatch, text, kw, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text(text)
    if said is None:
        assert build_options(cli(**kw), env={}).compile_mode == "max-autotune"
        return
    with pytest.raises(errors.ReprociError) as e:
        build_options(cli(**kw), env={})
    assert str(e.value).startswith(said) and e.value.return_code == errors.EXIT_USAGE


def test_an_error_from_a_named_config_file_names_that_file(tmp_path):
    (tmp_path / "team.yaml").write_text("world_size: 0\n")
    with pytest.raises(errors.UsageError, match=r"^.*team\.yaml: world_size must be at least 1 \(got 0\)"):
        build_options(cli(config=tmp_path / "team.yaml"), env={})


def test_stages_on_the_command_line_win_over_a_config_string(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("stages: throughput\n")
    assert build_options(cli(), env={}).stages == ("throughput",)
    assert build_options(cli(stages=("audit",)), env={}).stages == ("audit",)


def test_container_limits_read_docker_sizes_from_the_command_line_and_the_file(tmp_path, monkeypatch):
    o = build_options(cli(image="team/img:1"), env={})
    assert (o.memory, o.pids_limit) == (8 * 1024**3, 1024)  # the defaults
    o = build_options(cli(image="team/img:1", memory="512m", pids_limit=64), env={})
    assert (o.memory, o.pids_limit) == (512 * 1024**2, 64)
    assert build_options(cli(image="team/img:1", memory="1.5GiB"), env={}).memory == 3 * 1024**3 // 2
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("memory: 16g\npids_limit: 300\n")
    o = build_options(cli(image="team/img:1"), env={})
    assert (o.memory, o.pids_limit) == (16 * 1024**3, 300)


@pytest.mark.parametrize("kw, said", [
    ({"memory": "lots"}, "--memory 'lots' is not a size: write e.g. 8g, 512m or 16GiB"),
    ({"memory": "infg"}, "--memory 'infg' is not a size"),
    ({"memory": "64"}, "--memory '64' is under 64 MiB, too little for python3 and torch: give a unit, e.g. 8g"),
    ({"pids_limit": 4}, "--pids-limit 4 is under 16"),
    ({"memory": "8g", "image": None}, "--memory limits a container (--image)"),
    ({"pids_limit": 64, "image": None}, "--pids-limit limits a container (--image)"),
])
def test_a_container_limit_that_cannot_be_is_a_usage_error(kw, said):
    with pytest.raises(errors.UsageError) as e:
        build_options(cli(**{"image": "team/img:1", **kw}), env={})
    assert str(e.value).startswith(said), str(e.value)
