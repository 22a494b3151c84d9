"""Decisions: made at an adapter's first pass (what a generation needs, within one budget), shared
in the process, kept on disk, re-checked when read, and said on stderr when timed."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from eesd_products import products
from eesd_products.products import WIDE_ROWS
from tinymodels import make_tiny

from eesd_core.models import find_adapter

SHORT = list(range(1, 10))
WIDE = list(WIDE_ROWS)
STILL_WINNING = products._still_winning  # the real re-check (fake_calibration trusts every decision)


def ask(model: torch.nn.Module, *rows: int) -> list:
    """The products a new adapter of ``model`` gives passes over ``rows`` positions."""
    adapter = find_adapter(model)
    with torch.no_grad():
        return [adapter.products.product(m) for m in rows]


def kept(folder) -> dict:  # noqa: ANN001
    (path,) = folder.glob("*.json")
    return json.loads(path.read_text())


def kept_decisions(model: torch.nn.Module) -> dict:
    store = products._store_file(find_adapter(model))
    assert store is not None
    return products._read_decisions(store)


def new_process() -> None:
    products._DECISIONS.clear()


def new_boot() -> None:
    """A restart of the machine (the conftest's ``Boot``), then a new process."""
    products._boot.restarts += 1  # type: ignore[attr-defined]
    new_process()


def test_the_first_pass_decides_one_to_nine_and_the_wide_buckets_and_a_wider_short_one_what_it_adds(
    fake_calibration,
) -> None:  # noqa: ANN001
    model = make_tiny("llama", 0, dtype=torch.float32)
    fake_calibration.wins = {1: "transposed", 3: "onednn"}
    first = ask(model, 1, 2, 3, 9)
    assert fake_calibration.asked == [SHORT, WIDE]
    assert first[0] is products.linear_of("transposed") and first[2] is products.linear_of("onednn")
    assert first[1] is None and first[3] is None
    assert ask(model, 3, 1) == [first[2], first[0]], "another adapter of the model shares them"
    ask(model, 12)
    assert fake_calibration.asked == [SHORT, WIDE, [10, 11, 12]]


@pytest.mark.parametrize("rows", [1, 12, 600])
def test_the_first_pass_decides_whatever_its_row_count(rows: int, fake_calibration) -> None:  # noqa: ANN001
    ask(make_tiny("llama", 0, dtype=torch.float32), rows)
    assert fake_calibration.asked == [list(range(1, max(rows if rows <= 16 else 0, 9) + 1)), WIDE]


def test_a_decided_product_is_looked_up_not_made_again(fake_calibration) -> None:  # noqa: ANN001
    fake_calibration.wins = {2: "transposed"}
    adapter = find_adapter(make_tiny("llama", 0, dtype=torch.float32))
    first = adapter.products.product(2)
    assert all(adapter.products.product(2) is first for _ in range(3)) and len(fake_calibration.asked) == 2


def test_a_wide_pass_takes_its_buckets_decision(fake_calibration) -> None:  # noqa: ANN001
    fake_calibration.wins = {32: "onednn", 512: "onednn"}
    model = make_tiny("llama", 0, dtype=torch.float32)
    decided = ask(model, 20, 40, 4096)
    assert fake_calibration.asked == [SHORT, WIDE]
    assert decided == [products.linear_of("onednn"), None, products.linear_of("onednn")]


@pytest.mark.skipif(
    not products.onednn_serves(torch.float32, torch.device("cpu")), reason="no oneDNN linear in this torch"
)
def test_wide_buckets_are_timed_once_kept_and_read(monkeypatch, kinds, own_decisions) -> None:  # noqa: ANN001
    """Under a clock where a pass through oneDNN costs half a pass through F.linear, every bucket
    is decided for oneDNN, kept on disk with the boot it was timed in, read by a later process,
    and re-checked by the first process after a restart."""
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0 if "onednn" in kinds else 2.0
        kinds.clear()
        return now[0]

    monkeypatch.setattr(products, "_clock", clock)
    monkeypatch.setenv("EESD_PRODUCTS_BUDGET", "inf")
    model = make_tiny("llama", 6, dtype=torch.float32)
    assert ask(model, 40, 600) == [products.linear_of("onednn")] * 2
    assert {m: kept(own_decisions)[str(m)] for m in WIDE_ROWS} == {
        m: [True, [2.0, 1.0], "onednn", "boot-1"] for m in WIDE_ROWS
    }
    new_process()
    timed: list = []
    monkeypatch.setattr(products, "calibrate", lambda *args, **options: timed.append(args))
    before = now[0]
    assert ask(model, 20) == [products.linear_of("onednn")] and timed == []
    assert now[0] == before, "nothing is re-checked in the boot that timed them"
    new_boot()
    assert ask(model, 20) == [products.linear_of("onednn")] and timed == []
    assert now[0] > before, "the first process after a restart re-checks them"
    assert {kept(own_decisions)[str(m)][3] for m in WIDE_ROWS} == {"boot-2"}


def test_wide_passes_keep_f_linear_where_onednn_does_not_serve(monkeypatch, fake_calibration) -> None:  # noqa: ANN001
    monkeypatch.setattr(products, "onednn_serves", lambda dtype, device: False)
    assert ask(make_tiny("llama", 7, dtype=torch.float32), 40) == [None] and fake_calibration.asked == [SHORT]


def test_a_new_process_reads_the_decisions_instead_of_measuring(fake_calibration, own_decisions) -> None:  # noqa: ANN001
    """Calibrations are kept on disk: a process that has not measured a model reads them, and
    measures only the row counts they lack."""
    model = make_tiny("llama", 2, dtype=torch.float32)
    fake_calibration.wins = {2: "transposed"}
    first = ask(model, 1, 2)
    assert fake_calibration.asked == [SHORT, WIDE] and len(list(own_decisions.glob("*.json"))) == 1
    new_process()
    assert ask(model, 1, 2) == first and fake_calibration.asked == [SHORT, WIDE]
    new_process()
    ask(model, 12)
    assert fake_calibration.asked == [SHORT, WIDE, [10, 11, 12]]
    assert set(kept(own_decisions)) == {str(m) for m in [*range(1, 13), *WIDE]}


def test_decisions_are_kept_per_shape_and_thread_count(fake_calibration, own_decisions) -> None:  # noqa: ANN001
    ask(make_tiny("llama", 3, dtype=torch.float32), 1)
    ask(make_tiny("llama", 3, dtype=torch.float32, intermediate_size=96), 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        ask(make_tiny("llama", 3, dtype=torch.float32), 1)
    finally:
        torch.set_num_threads(threads)
    assert fake_calibration.asked == [SHORT, WIDE] * 3 and len(list(own_decisions.glob("*.json"))) == 3


def test_an_adapter_follows_the_thread_count_of_each_pass(fake_calibration) -> None:  # noqa: ANN001
    adapter = find_adapter(make_tiny("llama", 3, dtype=torch.float32))
    fake_calibration.wins = {1: "transposed"}
    assert adapter.products.product(1) is not None
    threads = torch.get_num_threads()
    fake_calibration.wins = {}
    torch.set_num_threads(threads + 1)
    try:
        assert adapter.products.product(1) is None
    finally:
        torch.set_num_threads(threads)
    assert adapter.products.product(1) is not None and fake_calibration.asked == [SHORT, WIDE] * 2


def test_decisions_for_other_products_are_not_read(monkeypatch, fake_calibration, own_decisions) -> None:  # noqa: ANN001
    """Decisions kept before the products changed timed other products: a new version of them
    measures again, in a file of its own."""
    model = make_tiny("llama", 3, dtype=torch.float32)
    ask(model, 1)
    new_process()
    monkeypatch.setattr(products, "PRODUCTS_VERSION", products.PRODUCTS_VERSION + 1)
    ask(model, 1)
    assert fake_calibration.asked == [SHORT, WIDE] * 2 and len(list(own_decisions.glob("*.json"))) == 2


def test_an_unreadable_file_is_measured_again_and_replaced(fake_calibration, own_decisions) -> None:  # noqa: ANN001
    model = make_tiny("llama", 4, dtype=torch.float32)
    ask(model, 2)
    (path,) = own_decisions.glob("*.json")
    broken_files = ('{"1": [true, ', '["not", "a", "table"]', '{"x": 1}', "null", '{"1": null}')
    for broken in (*broken_files, '{"1": [true, [2.0, 1.0], "transposed", 5]}'):
        path.write_text(broken)
        new_process()
        ask(model, 2)
        assert json.loads(path.read_text()).keys() == {str(m) for m in SHORT + WIDE}
    assert fake_calibration.asked == [SHORT, WIDE] * 7
    assert [p.name for p in own_decisions.iterdir()] == [path.name], "no temporary file is left"


def test_decisions_kept_without_their_boot_are_rechecked(
    monkeypatch,
    fake_calibration,
    own_decisions,  # noqa: ANN001
) -> None:
    """A file of the earlier layout (three fields a row, no boot): its products are re-checked
    by the first process that reads it, which then keeps the boot beside each."""
    model = make_tiny("llama", 4, dtype=torch.float32)
    store = products._store_file(find_adapter(model))
    assert store is not None
    store.parent.mkdir(parents=True)
    rows = {str(m): [m == 2, [2.0, 1.0 if m == 2 else 2.0], "transposed"] for m in SHORT}
    store.write_text(json.dumps(rows | {str(m): [False, [2.0, 2.0], "onednn"] for m in WIDE}))
    checked: list[list[int]] = []

    def rechecking(adapter, chosen, deadline):  # noqa: ANN001, ANN202
        checked.append(sorted(chosen))
        return dict.fromkeys(chosen, True)

    monkeypatch.setattr(products, "_still_winning", rechecking)
    assert ask(model, 2) == [products.linear_of("transposed")]
    assert checked == [[2]] and fake_calibration.asked == []
    assert kept(own_decisions)["2"] == [True, [2.0, 1.0], "transposed", "boot-1"]


def test_decisions_stay_in_the_process_when_asked_or_when_the_folder_is_not_writable(
    monkeypatch,
    tmp_path,
    fake_calibration,  # noqa: ANN001
) -> None:
    model = make_tiny("llama", 5, dtype=torch.float32)
    monkeypatch.setenv("EESD_PRODUCTS_DIR", "off")
    assert products.decisions_dir() is None
    ask(model, 1)
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("EESD_PRODUCTS_DIR", str(blocked / "products"))
    new_process()
    ask(model, 2)
    assert fake_calibration.asked == [SHORT, WIDE] * 2
    assert sorted(tmp_path.iterdir()) == [blocked]


def test_the_default_folder_is_in_eesds_cache(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.delenv("EESD_PRODUCTS_DIR")
    monkeypatch.setenv("EESD_CACHE_DIR", str(tmp_path / "cache"))
    assert products.decisions_dir() == tmp_path / "cache" / "products"
    monkeypatch.delenv("EESD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert products.decisions_dir() == tmp_path / "xdg" / "eesd" / "products"


def test_two_threads_never_calibrate_at_once(monkeypatch, fake_calibration) -> None:  # noqa: ANN001
    """The second waits for the first's calibration, then takes its decisions."""
    model = make_tiny("llama", 6, dtype=torch.float32)
    fake_calibration.wins = {1: "transposed"}
    running, overlaps = [0], []

    def slow(adapter, max_rows, **options):  # noqa: ANN001, ANN202
        running[0] += 1
        overlaps.append(running[0])
        time.sleep(0.2)
        running[0] -= 1
        return fake_calibration(adapter, max_rows, **options)

    monkeypatch.setattr(products, "calibrate", slow)
    adapters = [find_adapter(model) for _ in range(2)]
    got: list = [None, None]

    def asking(i: int) -> None:
        with torch.no_grad():
            got[i] = adapters[i].products.product(1)

    threads = [threading.Thread(target=asking, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == [1, 1] and fake_calibration.asked == [SHORT, WIDE]
    assert got[0] is got[1] is products.linear_of("transposed")


# -- the budget ----------------------------------------------------------------------------------


class _Virtual:
    """Virtual seconds for every clock of a calibration: each reading of the passes' clock costs
    one second, so that a row count costs 16 seconds (8 passes of 2 readings)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        monkeypatch.setattr(products, "_clock", self.tick)
        monkeypatch.setattr(products, "_now", lambda: self.now)
        monkeypatch.setattr(products, "onednn_serves", lambda dtype, device: False)  # two products

    def tick(self) -> float:
        self.now += 1.0
        return self.now


def test_the_budget_stops_a_calibration_and_leaves_the_rest_to_a_later_process(
    monkeypatch,
    own_decisions,
    capsys,  # noqa: ANN001
) -> None:
    _Virtual(monkeypatch)
    monkeypatch.setenv("EESD_PRODUCTS_BUDGET", "40")
    model = make_tiny("llama", 8, dtype=torch.float32)
    adapter = find_adapter(model)
    with torch.no_grad():
        assert [adapter.products.product(m) for m in SHORT] == [None] * 9
    assert set(kept(own_decisions)) == {"1", "2", *map(str, WIDE)}, "only the row counts decided are kept"
    assert "F.linear in this process, not timed, for passes over 3-9 positions" in adapter.products.describe()
    err = capsys.readouterr().err
    assert "passes over 3-9 positions keep F.linear in this process (the 40 s budget" in err
    new_process()
    timed: list[list[int]] = []
    calibrate = products.calibrate
    monkeypatch.setattr(
        products, "calibrate", lambda *a, **k: timed.append(list(k["only"])) or calibrate(*a, **k)
    )
    monkeypatch.setenv("EESD_PRODUCTS_BUDGET", "inf")
    ask(model, 1)
    assert timed == [list(range(3, 10))] and set(kept(own_decisions)) == {str(m) for m in SHORT + WIDE}


def _on_disk(model: torch.nn.Module, decided: dict[int, products.Decision]) -> None:
    """Decisions in ``model``'s file, as a process that timed them would have left them."""
    store = products._store_file(find_adapter(model))
    assert store is not None
    products._write_decisions(store, decided)


def _decided(planned: dict[int, str]) -> dict[int, products.Decision]:
    """Every short row count up to 9 and every bucket decided: ``planned`` for their product."""
    known = {
        m: (m in planned, (2.0, 1.0 if m in planned else 2.0), planned.get(m, "transposed")) for m in SHORT
    }
    known.update({m: (m in planned, (2.0, 2.0), planned.get(m, "onednn")) for m in WIDE})
    return known  # type: ignore[return-value]


class _Timeline:
    """Virtual seconds, a re-check that takes 3 of them and a calibration that takes 1 a row count
    (starting none once its budget is spent), each noting what it was asked and the seconds it had."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        self.calls: list[tuple[str, list[int], float]] = []
        monkeypatch.setattr(products, "_now", lambda: self.now)
        monkeypatch.setattr(products, "_still_winning", self.still_winning)
        monkeypatch.setattr(products, "calibrate", self.calibrate)

    def still_winning(self, adapter, chosen, deadline) -> dict[int, bool]:  # noqa: ANN001
        self.calls.append(("re-check", sorted(chosen), deadline - self.now))
        self.now += 3.0
        return dict.fromkeys(chosen, True)

    def calibrate(self, adapter, max_rows, *, only, budget, **options) -> products.MatmulPlan:  # noqa: ANN001
        self.calls.append(("time", list(only), budget))
        deadline, done = self.now + budget, []
        for m in only:
            if self.now >= deadline:
                break
            self.now += 1.0
            done.append(m)
        return products.MatmulPlan(frozenset(), {m: (2.0, 2.0) for m in done})


def test_the_first_pass_rechecks_then_times_short_then_wide_passes_within_one_budget(
    monkeypatch,
    own_decisions,
    capsys,  # noqa: ANN001
) -> None:
    """A file that decided 1-4 (a process whose budget ran out): the first pass of the next one
    re-checks those, times 5-9, then the buckets, all out of one budget of 10 seconds; later
    passes of every size time nothing."""
    model = make_tiny("llama", 4, dtype=torch.float32)
    _on_disk(model, {m: (True, (2.0, 1.0), "transposed") for m in range(1, 5)})
    monkeypatch.setenv("EESD_PRODUCTS_BUDGET", "10")
    timeline = _Timeline(monkeypatch)
    adapter = find_adapter(model)
    with torch.no_grad():
        assert adapter.products.product(7) is None
        assert timeline.calls == [
            ("re-check", [1, 2, 3, 4], 10.0),
            ("time", [5, 6, 7, 8, 9], 7.0),
            ("time", WIDE, 2.0),
        ]
        assert timeline.now == 10.0
        rows = [*SHORT, 17, 40, 64, 65, 600]
        assert [adapter.products.product(m) for m in rows] == [products.linear_of("transposed")] * 4 + [
            None
        ] * 10
    assert len(timeline.calls) == 3 and set(kept(own_decisions)) == {*map(str, range(1, 10)), "32", "64"}
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "passes over 5-9, 17-512 and more positions" in lines[0]
    assert "passes over 65-512 and more positions keep F.linear in this process (the 10 s budget" in lines[1]


def test_a_generation_times_only_at_its_first_pass(monkeypatch, capsys) -> None:  # noqa: ANN001
    """Rounds of eight drafts (passes over 1 to 9 positions) and a second generation read no
    clock of a timing: the first pass (the prefill) did all of it, timing in a first process and
    re-checking what it kept in a second."""
    from eesd_core import SpeculativeDecoder

    model = make_tiny("llama", 5, dtype=torch.float32)
    monkeypatch.setenv("EESD_PRODUCTS_BUDGET", "inf")
    passes, readings = [0], []
    product = products.CpuProducts.product

    def counting(self, rows: int):  # noqa: ANN001, ANN202
        if products._FORCED.get() is products._FREE:
            passes[0] += 1
        return product(self, rows)

    def clock() -> float:
        readings.append(passes[0])
        return time.perf_counter()

    monkeypatch.setattr(products.CpuProducts, "product", counting)
    monkeypatch.setattr(products, "_clock", clock)
    ids = torch.arange(3, 12).view(1, -1)
    for process in range(2):
        new_process()
        passes[0] = 0
        readings.clear()
        if process:  # a product kept for passes over 1 position, re-checked at the first pass
            _on_disk(model, {**kept_decisions(model), 1: (True, (2.0, 1.0), "transposed")})
        decoder = SpeculativeDecoder(
            model,
            drafter="early_exit",
            drafter_options={"exit_layer": 2},
            controller="fixed",
            controller_options={"k": 8},
        )
        for _ in range(2):
            decoder.generate(ids, max_new_tokens=20, eos_token_id=[])
        assert passes[0] > 10 and readings and set(readings) == {1}
    capsys.readouterr()


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_budget_is_a_config_error(monkeypatch, value: str) -> None:  # noqa: ANN001
    from eesd_core.errors import ConfigError

    monkeypatch.setenv("EESD_PRODUCTS_BUDGET", value)
    with pytest.raises(ConfigError, match="EESD_PRODUCTS_BUDGET"):
        find_adapter(make_tiny("llama", 0, dtype=torch.float32))


# -- what is said, and re-checks of what a file says ---------------------------------------------


def test_a_calibration_says_what_it_does_and_reading_decisions_says_nothing(fake_calibration, capsys) -> None:  # noqa: ANN001
    model = make_tiny("llama", 9, dtype=torch.float32)
    fake_calibration.wins = {2: "transposed"}
    ask(model, 1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "eesd: timing linear products for passes over 1-9, 17-512 and more positions of this model on "
        "this CPU (once per machine; --products standard or EESD_PRODUCTS=standard skips it)"
    )
    assert lines[1].startswith("eesd: timed linear products in ") and lines[1].endswith(
        " s: transposed product for passes over m = 2; "
        "F.linear for passes over 1, 3-9, 17-512 and more positions"
    )
    assert len(lines) == 2
    new_process()
    ask(model, 1, 2, 9)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("cost", [1.0, 1.9, 3.0])
def test_kept_choices_are_rechecked_at_the_first_pass_and_dropped_if_they_are_no_longer_faster(
    cost: float,
    monkeypatch,
    spy,
    fake_calibration,
    own_decisions,
    capsys,  # noqa: ANN001
) -> None:
    """Decided on a machine where the transposed product won clearly; read by a process where a
    reading after it costs 1.0 (still a clear win over F.linear's 2.0), 1.9 (a narrow one, which
    a re-check keeps: it would not be adopted afresh) or 3.0 (a loss)."""
    still = cost < 2.0
    model = make_tiny("llama", 9, dtype=torch.float32)
    fake_calibration.wins = {1: "transposed", 2: "transposed"}
    ask(model, 1)
    new_process()
    assert ask(model, 1, 2) == [products.linear_of("transposed")] * 2
    new_boot()
    capsys.readouterr()
    checked: list[list[int]] = []

    def rechecking(adapter, chosen, deadline):  # noqa: ANN001, ANN202
        checked.append(sorted(chosen))
        return STILL_WINNING(adapter, chosen, deadline)

    monkeypatch.setattr(products, "_still_winning", rechecking)
    now = [0.0]

    def clock() -> float:
        now[0] += cost if spy else 2.0
        spy.clear()
        return now[0]

    monkeypatch.setattr(products, "_clock", clock)
    adapter = find_adapter(model)
    with torch.no_grad():
        chosen = [adapter.products.product(m) for m in (5, 1, 2, 1)]
    assert checked == [[1, 2]], "one re-check of both, at the first pass after a restart"
    transposed = products.linear_of("transposed")
    assert chosen == ([None, transposed, transposed, transposed] if still else [None] * 4)
    assert kept(own_decisions)["1"][0] == kept(own_decisions)["2"][0] == still
    assert kept(own_decisions)["1"][3] == "boot-2", "kept with the boot that re-checked it"
    err = capsys.readouterr().err.splitlines()
    if still:
        assert err == []
        return
    assert len(err) == 1 and err[0].startswith("eesd: re-checked the linear products read from disk in ")
    assert err[0].endswith(
        "s: passes over 1-2 positions are no longer faster with the product read from disk: F.linear "
        "for them until the machine restarts (the first process after that times them again)"
    )
    new_process()
    assert ask(model, 1, 2) == [None, None] and fake_calibration.asked == [SHORT, WIDE]
    assert checked == [[1, 2]], "a later process of the same boot neither re-checks nor times them"
    new_boot()
    ask(model, 1)
    assert fake_calibration.asked == [SHORT, WIDE, [1, 2]], "the first process after a restart times them"


def test_a_recheck_is_one_sweep_and_what_the_budget_leaves_unchecked_keeps_f_linear_and_its_file(
    monkeypatch,
    spy,
    own_decisions,
    capsys,  # noqa: ANN001
) -> None:
    """Four products read from disk, re-checked in one sweep under a clock where a pass costs 4
    seconds through F.linear and 3 through the transposed product: the untimed pass (4 s) and a
    first repeat (28 s) fit a budget of 40, of the second only the row count it starts with."""
    monkeypatch.setattr(products, "SAMPLE_BYTES", 1)  # one layer a pass, its time scaled to all
    model = make_tiny("llama", 9, dtype=torch.float32)
    _on_disk(model, _decided(dict.fromkeys(range(1, 5), "transposed")))
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0 if spy else 2.0
        spy.clear()
        return now[0]

    monkeypatch.setattr(products, "_clock", clock)
    monkeypatch.setattr(products, "_now", lambda: now[0])
    monkeypatch.setenv("EESD_PRODUCTS_BUDGET", "40")
    made, swept = [], []

    class Passes(products._Passes):
        def __init__(self, adapter, layers, head, *args) -> None:  # noqa: ANN001
            made.append((layers, head))
            super().__init__(adapter, layers, head, *args)

        def __call__(self, m: int, linear):  # noqa: ANN001, ANN204
            swept.append(m)
            return super().__call__(m, linear)

    monkeypatch.setattr(products, "_Passes", Passes)
    adapter = find_adapter(model)
    with torch.no_grad():
        got = [adapter.products.product(m) for m in range(1, 6)]
    assert made == [(1, False)] and swept == [1, 1, 1, 2, 2, 3, 3, 4, 4, 4, 4]
    assert now[0] == 39.0
    assert got == [None, None, None, products.linear_of("transposed"), None]
    assert all(kept(own_decisions)[str(m)][0] for m in range(1, 5)), "the file keeps them all"
    assert adapter.products.describe().endswith(
        "F.linear in this process, not re-checked, for passes over 1-3 positions"
    )
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "eesd: re-checked the linear products read from disk in 39.0 s: passes over 1-3 positions keep "
        "F.linear in this process, not re-checked (the 40 s budget ran out; the file keeps their product)"
    ]


def test_a_third_repeat_times_only_the_row_counts_whose_passes_are_not_clearly_apart(
    monkeypatch,
    spy,
    own_decisions,  # noqa: ANN001
) -> None:
    """Through the transposed product a pass over one position costs what F.linear's does, over 2
    to 4 half of it: only m = 1 takes a third repeat, which drops it (no longer faster)."""
    model = make_tiny("llama", 9, dtype=torch.float32)
    _on_disk(model, _decided(dict.fromkeys(range(1, 5), "transposed")))
    now = [0.0]

    def clock() -> float:
        now[0] += (2.0 if spy[0] == 1 else 1.0) if spy else 2.0
        spy.clear()
        return now[0]

    monkeypatch.setattr(products, "_clock", clock)
    monkeypatch.setenv("EESD_PRODUCTS_BUDGET", "inf")
    swept: list[int] = []

    class Passes(products._Passes):
        def __call__(self, m: int, linear):  # noqa: ANN001, ANN204
            swept.append(m)
            return super().__call__(m, linear)

    monkeypatch.setattr(products, "_Passes", Passes)
    got = ask(model, 1, 2, 3, 4)
    assert swept == [1, *[1, 1, 2, 2, 3, 3, 4, 4], *[4, 4, 3, 3, 2, 2, 1, 1], 1, 1]
    assert got == [None, *[products.linear_of("transposed")] * 3]
    assert not kept(own_decisions)["1"][0] and all(kept(own_decisions)[str(m)][0] for m in range(2, 5))


# -- layers a proposer moved off the device ------------------------------------------------------


def _layers_timed(monkeypatch) -> list[int]:  # noqa: ANN001
    """How many layers each timed pass (and each timing of matrices by shape) runs."""
    layers: list[int] = []

    class Passes(products._Passes):
        def __init__(self, adapter, count, *args) -> None:  # noqa: ANN001
            layers.append(count)
            super().__init__(adapter, count, *args)

    shapes = products._shape_products

    def by_shape(adapter, count, *args):  # noqa: ANN001, ANN202
        layers.append(count)
        return shapes(adapter, count, *args)

    monkeypatch.setattr(products, "_Passes", Passes)
    monkeypatch.setattr(products, "_shape_products", by_shape)
    return layers


def test_timings_run_only_the_layers_left_on_the_device(monkeypatch, capsys) -> None:  # noqa: ANN001
    """Layers 2 and 3 moved to ``meta`` after the adapter was made (as a proposer does): the
    timing and the re-check run layers 0 and 1 only (the whole sample of so small a model)."""
    model = make_tiny("llama", 6, dtype=torch.float32)
    _on_disk(model, {1: (True, (2.0, 1.0), "transposed")})
    adapter = find_adapter(model)
    for layer in model.model.layers[2:]:
        layer.to("meta")
    layers = _layers_timed(monkeypatch)
    monkeypatch.setenv("EESD_PRODUCTS_BUDGET", "inf")
    adapter.products.budget = float("inf")
    assert products.runnable_layers(adapter) == 2
    with torch.no_grad():
        adapter.products.product(8)
    assert layers and set(layers) == {2}
    assert "timed linear products" in capsys.readouterr().err


def test_with_no_layer_on_the_device_nothing_is_timed(monkeypatch, own_decisions, capsys) -> None:  # noqa: ANN001
    model = make_tiny("llama", 6, dtype=torch.float32)
    _on_disk(model, {1: (True, (2.0, 1.0), "transposed")})
    adapter = find_adapter(model)
    for layer in model.model.layers:
        layer.to("meta")
    layers = _layers_timed(monkeypatch)
    monkeypatch.setattr(products, "_clock", lambda: pytest.fail("a timing ran"))
    with torch.no_grad():
        assert [adapter.products.product(m) for m in [*SHORT, 40, 600]] == [None] * 11
    assert layers == [] and capsys.readouterr().err == ""
    assert kept(own_decisions) == {"1": [True, [2.0, 1.0], "transposed", None]}, "the file is left as it was"
    assert products.calibrate(adapter, 3).timings == {}
    described = adapter.products.describe()
    assert "not timed, for passes over 2-9, 17-512 and more positions" in described
    assert described.endswith("not re-checked, for passes over 1 position")
