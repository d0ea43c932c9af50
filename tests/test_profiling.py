"""The throughput stage's per-op times: read from the profiler's raw events on the CPU, they
are what its event list gives, in a fraction of the time."""

import torch

from reproci.worker import profiling


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((3,), float(i)) ** 2  # a few small ops per sample, as a real loader has


def _profile(steps: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(torch.utils.data.DataLoader(Squares(), batch_size=8))
    prof = profiling.start_profiler(torch.device("cpu"), steps)
    for _ in range(steps):
        x = next(batches)
        with torch.profiler.record_function("outer"):
            with torch.profiler.record_function("outer"):  # an only child of its own name: merged
                torch.sort(x, dim=0)
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        prof.step()
    prof.stop()
    return prof


def test_the_raw_events_give_the_event_lists_self_times_and_calls():
    prof = _profile()
    raw = {r["name"]: r for r in profiling.op_times(prof, torch.device("cpu"), raw=True)}
    listed = {r["name"]: r for r in profiling.op_times(prof, torch.device("cpu"), raw=False)}
    assert raw.keys() == listed.keys()
    assert {"outer", "aten::sort", "aten::linear", "(outside ops)"} <= raw.keys()
    for name, row in listed.items():
        assert raw[name]["calls"] == row["calls"], name
        assert abs(raw[name]["self_cpu_us"] - row["self_cpu_us"]) <= 1e-6 * max(1.0, row["self_cpu_us"]), name
    assert raw["outer"]["calls"] == 1  # the nested "outer" merged into its parent


def test_raw_events_keep_nanoseconds_where_microseconds_since_the_epoch_would_round():
    """Event times are nanoseconds since the epoch: as float microseconds they round to a
    quarter of a microsecond, which would move self times of the smallest ops by as much."""
    events = profiling._raw_cpu_events(_profile(steps=2))
    assert min(start for _, start, _, _, _ in events) == 0.0
    assert all(0.0 <= self_us <= end - start + 1e-9 for _, start, end, self_us, _ in events)
