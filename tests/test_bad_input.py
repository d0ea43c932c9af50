"""Bad input and faults: one line on stderr, the documented exit code, nothing written.

Each test drives the real CLI (in-process through ``main`` where nothing trains, a
subprocess where a signal or a run is involved) and asserts the exit code, that stderr's
last line is the one-line message with no traceback, and what is (not) left on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from reproci import errors

from .helpers import ROOT, interruptible, left_behind, started_by

RUN = ("run", "-m", "embedding", "--steps", "2")


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("args, code, fragment", [
    (("--seed", "-1"), errors.EXIT_USAGE, "--seed -1 is out of range: use 0 .. 4294967295"),
    (("--seed", "99999999999999999999"), errors.EXIT_USAGE, "out of range"),
    (("--image", ""), errors.EXIT_USAGE, "--image is empty"),
    (("--image", "foo", "--gpus", "banana"), errors.EXIT_USAGE, "--gpus 'banana': use all, a count"),
    (("--steps", "99999999999999999999999"), errors.EXIT_USAGE, "is more than 1,000,000 steps a run"),
])
def test_bad_values_are_refused_before_any_run(cli, tmp_path, monkeypatch, args, code, fragment):
    monkeypatch.chdir(tmp_path)
    got, out, err = cli(*RUN, *args)
    assert got == code and fragment in one_line(err)
    assert not (tmp_path / "results").exists()


def test_a_golden_of_binary_garbage_is_exit_6_and_golden_update_replaces_it(cli, reproci, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "goldens").mkdir()
    (tmp_path / "goldens" / "local.yaml").write_bytes(bytes(range(256)) * 4)
    for args in (RUN, ("golden", "show", "local")):
        got, _, err = cli(*args)
        assert got == errors.EXIT_GOLDEN and "unreadable golden (not UTF-8 text" in one_line(err)
    p = reproci("golden", "update", *RUN[1:])
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "goldens" / "local.yaml").read_text().startswith("# reproci golden hashes")


def test_a_config_that_is_not_text_is_a_usage_error(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_bytes(b"\xff\xfe\x00steps: 3")
    got, _, err = cli(*RUN, "--config", "bad.yaml")
    assert got == errors.EXIT_USAGE and "bad.yaml: not UTF-8 text" in one_line(err)


def test_a_goldens_dir_that_is_a_file_is_refused_before_training(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    got, _, err = cli("golden", "update", *RUN[1:], "--goldens-dir", "afile")
    assert got == errors.EXIT_USAGE and "--goldens-dir afile is a file, not a directory" in one_line(err)
    assert not (tmp_path / "results").exists()


def test_a_goldens_dir_that_does_not_exist_is_said_and_in_ci_refused(cli, reproci, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got, _, err = cli(*RUN, "--goldens-dir", "typo", "--ci")
    assert got == errors.EXIT_USAGE and "--goldens-dir typo does not exist: check the path" in one_line(err)
    p = reproci(*RUN, "--goldens-dir", "typo")
    assert p.returncode == 0 and "notice: --goldens-dir typo does not exist" in p.stderr


@pytest.mark.slow
def test_the_printed_golden_update_command_clears_the_notice(reproci):
    """After a plugin run with its own steps, resume point and goldens dir, the advice carries them."""
    plugin = str(ROOT / "tests" / "plugins" / "idioms.py") + ":namedtuple_batch"
    args = ("-m", plugin, "--steps", "8", "--resume-at", "3", "--goldens-dir", "gd")
    p = reproci("run", *args)
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stderr.splitlines() if x.startswith("notice: no golden"))
    command = line.split("`")[1]
    assert command == f"reproci golden update --image local -m {plugin} --steps 8 --resume-at 3 --goldens-dir gd"
    assert reproci(*command.split()[1:]).returncode == 0
    q = reproci("run", *args)
    assert q.returncode == 0 and "notice: no golden" not in q.stderr
    assert reproci.latest()["models"][0]["verdict"] == "PASS"


@pytest.mark.slow
def test_sigterm_stops_the_run_cleanly_with_exit_143(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": ""}
    proc = subprocess.Popen([sys.executable, "-m", "reproci.cli", *RUN[:3], "--steps", "400"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("results/*/embedding/spec-A.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == errors.EXIT_TERMINATED, err
    assert one_line(err) == "terminated (SIGTERM): unfinished runs were stopped; nothing was recorded"
    assert not list(tmp_path.glob("results/2*")), "the unfinished run directory is removed"
    assert left_behind(tmp_path, pid=proc.pid) == []  # no worker, no fork server


def test_a_killed_worker_is_said_as_killed_not_as_an_exit_code():
    from reproci.errors import how_ended

    assert how_ended(-9) == "was killed (SIGKILL: out of memory, or killed by hand)"
    assert how_ended(137) == "was killed (SIGKILL: out of memory, or killed by hand)"
    assert how_ended(1) == "died with exit code 1"


def test_the_cli_starts_without_importing_torch():
    """`reproci --version` and `--help` answer at once: torch (seconds to import) is the workers'."""
    code = "import sys, reproci.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
    out = subprocess.run([sys.executable, "-m", "reproci.cli", "--version"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "reproci, version 0.1.0"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_reproci_leaves_no_worker_and_the_next_run_sweeps_its_directory(tmp_path):
    """A worker in a step that prints nothing for an hour (it would never notice its closed pipe)
    dies with the reproci that launched it, killed by SIGKILL."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": ""}
    hang = f"{ROOT / 'tests' / 'plugins' / 'faulty.py'}:hang"
    proc = subprocess.Popen([sys.executable, "-m", "reproci.cli", "run", "-m", hang, "--steps", "4", "-j", "1"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(p.works_in(tmp_path / "results") for p in started_by(tmp_path, pid=proc.pid)):
        assert time.monotonic() < deadline, "no worker started"
        time.sleep(0.2)
    run_dirs = list(tmp_path.glob("results/2*"))
    proc.kill()
    proc.wait()
    assert left_behind(tmp_path, pid=proc.pid, within=30) == [], "the worker or its server outlived its reproci"
    assert run_dirs and all(d.exists() for d in run_dirs)  # SIGKILL: nobody could clean up
    q = subprocess.run([sys.executable, "-m", "reproci.cli", *RUN], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert q.returncode == 0, q.stderr
    assert f"notice: removed {run_dirs[0].relative_to(tmp_path)}: the unfinished run of a reproci process that is gone" \
        in q.stderr
    assert not run_dirs[0].exists()


# --- issue 36: the new options under bad input (CPU cap, compile, goldens) ---

from pathlib import Path  # noqa: E402

from reproci import cpu_flags  # noqa: E402

# Real /proc/cpuinfo text (first processor, trimmed to the fields read): an AVX2-only AMD EPYC
# (Zen 2, a KVM guest), an AVX512 Intel Xeon (Skylake-SP) and an Arm Neoverse N1.
EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht \
syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid extd_apicid \
tsc_known_freq pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c \
rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext ssbd ibpb vmmcall \
fsgsbase tsc_adjust bmi1 avx2 smep bmi2 rdseed adx smap clflushopt sha_ni xsaveopt xsavec xgetbv1 clzero xsaveerptr \
virt_ssbd arat

processor\t: 1
flags\t\t: fpu
"""
XEON_AVX512 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht \
syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq pni \
pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand \
hypervisor lahf_lm abm 3dnowprefetch invpcid_single pti fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm \
mpx avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves ida \
arat pku ospke
"""
NEOVERSE_N1 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
"""


def test_a_cpu_isa_level_is_checked_against_the_cpus_own_flags():
    assert cpu_flags.lacks("avx512", EPYC_AVX2) == "this CPU has no AVX512 (flags: sse4_2 avx avx2 fma f16c)"
    assert cpu_flags.instead("avx512", EPYC_AVX2) == "avx2 (or native)"
    assert cpu_flags.lacks("avx2", EPYC_AVX2) is None
    assert cpu_flags.lacks("avx512", XEON_AVX512) is None and cpu_flags.lacks("avx2", XEON_AVX512) is None
    assert cpu_flags.lacks("avx2", NEOVERSE_N1) == "this CPU has no AVX2 (flags: asimd)"
    assert cpu_flags.instead("avx2", NEOVERSE_N1) == "native"
    assert cpu_flags.lacks("avx512", "processor\t: 0\n") is None  # no flags listed: not refused, the run attests


def _lacking_level() -> str | None:
    """A --cpu-isa level this host's CPU lacks (the CLI can show the refusal only there)."""
    return next((level for level in ("avx512", "avx2") if cpu_flags.host_lacks(level)), None)


needs_a_lacking_level = pytest.mark.skipif(_lacking_level() is None, reason="this CPU has every --cpu-isa level")


def _one_error_line(capsys) -> str:
    """stderr of an in-process ``main``: exactly one line, an error, no traceback."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@needs_a_lacking_level
def test_a_cpu_isa_this_cpu_lacks_is_refused_before_any_run(capsys, tmp_path, monkeypatch):
    from reproci.cli import main

    level = _lacking_level()
    monkeypatch.chdir(tmp_path)
    assert main([*RUN, "--cpu-isa", level]) == errors.EXIT_USAGE
    line = _one_error_line(capsys)
    assert line.startswith(f"error: --cpu-isa {level}: this CPU has no {level.upper()} (flags: ")
    assert "every run would die of an illegal instruction: pass --cpu-isa " in line
    (tmp_path / "reproci.yaml").write_text(f"cpu_isa: {level}\n")
    assert main(list(RUN)) == errors.EXIT_USAGE
    assert _one_error_line(capsys).startswith(f"error: reproci.yaml: cpu_isa {level}: this CPU has no {level.upper()}")
    assert not (tmp_path / "results").exists()


@needs_a_lacking_level
def test_an_image_capped_above_this_cpu_is_an_infrastructure_error(capsys, tmp_path, monkeypatch):
    """No engine is reached: the manifest's cap is refused when the options are made."""
    from reproci.cli import main

    level = _lacking_level()
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "manifest.yaml").write_text(
        "version: 1\nimages:\n  capped:\n    tag: reproci/capped:1\n    base: {image: base:1}\n"
        f"    requirements: requirements/capped.txt\n    cpu_isa: {level}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--image", "capped", "-m", "embedding", "--steps", "2"]) == errors.EXIT_INFRA
    line = _one_error_line(capsys)
    assert line.startswith(f"error: image capped caps the CPU kernels at cpu_isa {level} (")
    assert f"but this CPU has no {level.upper()} (flags: " in line and "or pass --cpu-isa " in line
    assert main(["run", "--image", "capped", "--cpu-isa", "native", "--timeout", "0"]) == errors.EXIT_USAGE
    assert "--timeout must be positive" in _one_error_line(capsys)  # the flag lifts the cap: no refusal for it


@needs_a_lacking_level
def test_the_golden_cause_never_runs_a_level_this_cpu_lacks():
    """A golden recorded at a level this CPU lacks: named as unsettable, not re-run to its SIGILL."""
    from reproci.stages.determinism.golden_cause import settings

    level = _lacking_level()
    change, unsettable = settings({"cpu_capability": [level.upper(), "DEFAULT"]})
    assert "cpu_isa" not in change
    assert unsettable == [f"CPU capability (ATen) {level.upper()} → DEFAULT: this CPU has no {level.upper()} "
                          f"(flags: {cpu_flags.host_lacks(level)[0].split('(flags: ')[1]}"]


def test_a_worker_killed_by_sigill_names_illegal_instructions():
    from reproci.errors import how_ended

    for code in (-signal.SIGILL, 128 + signal.SIGILL):  # a process, a container
        assert how_ended(code).startswith("was killed (SIGILL: an illegal instruction, likely code built for "
                                       "instructions this CPU lacks: a --cpu-isa or image cpu_isa above this CPU")


ILLEGAL = '''
import os
import signal

import torch
from torch import nn

from reproci.worker.contract import ModelContext, TrainSetup


def build(ctx: ModelContext) -> TrainSetup:
    model = nn.Linear(4, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 4), torch.zeros(8, 1)),
                                         batch_size=4)

    def loss_fn(m, b):
        os.kill(os.getpid(), signal.SIGILL)  # as a kernel built for instructions the CPU lacks
        return nn.functional.mse_loss(m(b[0]), b[1])
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader,
                      loss_fn=loss_fn)
'''


@pytest.mark.slow
def test_a_run_killed_by_sigill_says_illegal_instruction(reproci):
    (reproci.cwd / "illegal.py").write_text(ILLEGAL)
    p = reproci("run", "-m", "illegal.py:build", "--steps", "2")
    assert p.returncode == errors.EXIT_RUN_ERROR, p.stderr
    assert "illegal: ERROR: run A was killed (SIGILL: an illegal instruction, likely code built for instructions " \
           "this CPU lacks" in p.stdout.replace("\n", " ") + p.stderr.replace("\n", " ")


@pytest.mark.slow
def test_compile_mode_default_without_compile_is_accepted(cli, tmp_path, monkeypatch):
    """The default mode is what an uncompiled run has: saying it is not an error (the yaml key:
    tests/test_options.py)."""
    monkeypatch.chdir(tmp_path)
    got, _, err = cli(*RUN, "--compile-mode", "default")
    assert got == 0, err


def test_a_compile_setting_error_names_it_as_written(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got, _, err = cli(*RUN, "--compile-mode", "max-autotune")
    assert got == errors.EXIT_USAGE and one_line(err) == \
        "error: --compile-mode sets how torch.compile compiles: add --compile"
    (tmp_path / "team.yaml").write_text("compile_mode: max-autotune\n")
    got, _, err = cli(*RUN, "--config", "team.yaml")
    assert got == errors.EXIT_USAGE and one_line(err) == \
        "error: team.yaml: compile_mode sets how torch.compile compiles: add compile: true (or --compile)"
    (tmp_path / "team.yaml").write_text("compile: [conv]\n")
    got, _, err = cli(*RUN, "--config", "team.yaml")
    assert got == errors.EXIT_USAGE and one_line(err).startswith(
        "error: team.yaml: compile: conv is not among the models run (embedding)")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("verb", [("golden", "show", "local"), ("golden", "diff", "a", "b"),
                                  ("golden", "update", *RUN[1:]), RUN])
def test_a_goldens_dir_that_is_a_file_is_said_by_every_command(cli, verb):
    got, _, err = cli(*verb, "--goldens-dir", "/etc/passwd")
    assert got == errors.EXIT_USAGE
    assert one_line(err) == ("error: --goldens-dir /etc/passwd is a file, not a directory; name the directory that "
                             "holds the goldens")


def _write_golden(goldens: Path, name: str, run: int, **identity) -> None:
    from reproci import plugins
    from reproci.golden import store

    from .test_golden import fake_run

    document, records, states = fake_run(run)  # a golden of model m, 5 steps, seed 0, hash of `run`
    document["models"][0].update(identity)
    store.write(goldens, name, document, records, states, plugins.stages())


def test_golden_diff_of_other_settings_names_them_and_compares_nothing(cli, tmp_path):
    _write_golden(tmp_path, "a", 1)
    _write_golden(tmp_path, "b", 2, steps=4, seed=3)
    _write_golden(tmp_path, "c", 3)
    got, out, err = cli("golden", "diff", "a", "b", "--goldens-dir", str(tmp_path))
    assert got == 0, err
    assert ("m: not comparable: steps 5 vs 4, seed 0 vs 3: re-record one with the other's settings to compare "
            "them") in out
    assert "final loss digits" not in out and "differs" not in out  # no comparison where there is none
    got, out, err = cli("golden", "diff", "a", "c", "--goldens-dir", str(tmp_path))
    assert got == 0 and "not comparable" not in out and "final loss digits" in out
    assert [[c.strip() for c in row.split("│")[1:3]] for row in out.splitlines() if row.startswith("│ m ")] == \
        [["m", "differs"]]


# Wrong values of the new options, as flags and as reproci.yaml keys: each is refused before any
# run with exit 2 and one line saying what to do, never a traceback.
FUZZ = [
    (("--compile-mode", "fast"), None, "Invalid value for '--compile-mode': 'fast' is not one of"),
    (("--compile-mode", ""), None, "Invalid value for '--compile-mode'"),
    (("--compile=yes",), None, "Option '--compile' does not take a value"),
    (("--compile-mode", "reduce-overhead"), None, "--compile-mode sets how torch.compile compiles: add --compile"),
    (("--amp", "fp8"), None, "Invalid value for '--amp': 'fp8' is not one of 'bf16', 'fp16'"),
    (("--amp", "FP16"), None, "Invalid value for '--amp'"),
    (("--cpu-isa", "avx1024"), None, "Invalid value for '--cpu-isa': 'avx1024' is not one of"),
    (("--cpu-isa", ""), None, "Invalid value for '--cpu-isa'"),
    (("--bisect=1",), None, "Option '--bisect' does not take a value"),
    (("--blame",), None, "--blame compares images: name the new one with --image"),
    (("--blame", "--image", "local"), None, "--blame compares images"),
    (("--stage", "blame"), None, "--stage blame compares images"),
    ((), "compile: 3", "reproci.yaml: compile: expected true, false or a list of the models to compile, got 3"),
    ((), "compile: {a: 1}", "reproci.yaml: compile: expected true, false or a list"),
    ((), "compile: [1, 2]", "reproci.yaml: compile: expected true, false or a list"),
    ((), "compile: ''", "reproci.yaml: compile: '' is not among the models run (embedding)"),
    ((), "compile: nosuch", "reproci.yaml: compile: nosuch is not among the models run (embedding)"),
    ((), "compile_mode: 3", "reproci.yaml: compile_mode: expected one of default, reduce-overhead"),
    ((), "compile_mode: [default]", "reproci.yaml: compile_mode: expected one of"),
    ((), "compile_mode: max-autotune", "reproci.yaml: compile_mode sets how torch.compile compiles"),
    ((), "amp: true", "reproci.yaml: amp: expected bf16 or fp16, got True"),
    ((), "amp: [bf16]", "reproci.yaml: amp: expected bf16 or fp16"),
    ((), "cpu_isa: AVX2", "reproci.yaml: cpu_isa: expected one of avx2, avx512, native, got 'AVX2'"),
    ((), "cpu_isa: 2", "reproci.yaml: cpu_isa: expected one of"),
    ((), "bisect: 'yes'", "reproci.yaml: bisect: expected true or false, got 'yes'"),
    ((), "bisect: 1", "reproci.yaml: bisect: expected true or false"),
    ((), "blame: [x]", "reproci.yaml: blame: expected true or false"),
    ((), "blame: true", "reproci.yaml: blame compares images: name the new one with --image"),
    ((), "stages: blame", "reproci.yaml: stages blame compares images"),
    ((), "repetitions: 0", "reproci.yaml: repetitions must be at least 1 (got 0)"),
    ((), "slowdown_factor: .nan", "reproci.yaml: slowdown_factor must be a positive number"),
    ((), "timeout: .inf", "reproci.yaml: timeout must be positive"),
    (("--timeout", "nan"), None, "--timeout must be positive"),
    (("--slowdown-factor", "-1"), None, "--slowdown-factor must be a positive number"),
    (("--config", "no.yaml"), None, "config file no.yaml does not exist"),
]
VERBS = [(("bisect",), "reproci bisect needs the model that failed: -m MODEL"),
         (("blame", "-m", "embedding"), "reproci blame compares images: name the new one with --image"),
         (("blame", "--image", "local", "-m", "embedding"), "reproci blame compares images")]


def test_blame_takes_the_image_of_reproci_yaml(capsys, tmp_path, monkeypatch):
    """``image:`` in reproci.yaml is the image a blame compares, as for ``reproci run``: the
    command goes on to look for that image's golden (and says there is none, before any run)
    instead of asking for --image."""
    from reproci.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("image: reproci/no-such-image:1\nmodels: [embedding]\n")
    code = main(["blame"])
    line = _one_error_line(capsys)
    assert code == errors.EXIT_USAGE and "no golden for reproci_no-such-image_1" in line, line
    assert "name the new one with --image" not in line, line
    assert not (tmp_path / "results").exists()  # nor the folder the run made for its results


@pytest.mark.parametrize("args, config, fragment", FUZZ + [(v, None, f) for v, f in VERBS])
def test_wrong_values_of_the_new_options_are_one_line_and_exit_2(capsys, tmp_path, monkeypatch, args, config, fragment):
    from reproci.cli import main

    monkeypatch.chdir(tmp_path)
    if config is not None:
        (tmp_path / "reproci.yaml").write_text(config + "\n")
    argv = list(args) if args[:1] in (("bisect",), ("blame",)) else [*RUN, *args]
    assert main(argv) == errors.EXIT_USAGE
    assert fragment in _one_error_line(capsys)
    assert not (tmp_path / "results").exists()
