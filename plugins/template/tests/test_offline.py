"""Evaluate the controller offline: replay it through a trace eesd ships, beside Thompson sampling,
in modelled time (the same as `eesd controllers evaluate --controllers my_controller thompson`)."""

from eesd_bench.evaluate import format_board, leaderboard, matching_profiles
from eesd_bench.profiles import load_profile, shipped_profiles
from eesd_bench.tracefile import load_trace, shipped_traces


def test_my_controller_on_a_shipped_trace():
    trace = load_trace(next(iter(shipped_traces())))
    profiles = {name: load_profile(name) for name in shipped_profiles()}
    profile = profiles[matching_profiles(trace, profiles)[0]]  # one measured for the trace's model
    controllers = {"my_controller": ("my_controller", {}), "thompson": ("thompson", {})}
    board = leaderboard(trace, profile, controllers)
    print(format_board(board))  # pytest -s shows the leaderboard
    mine = board["rows"]["my_controller"]
    assert set(mine) == set(board["categories"])
    assert all(cell["vs_oracle"] >= 1.0 for cell in mine.values())  # no schedule beats the oracle
