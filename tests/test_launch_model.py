"""The model that picks resident mode's rounds per launch from measured costs."""

from rafi._engines._resident import LaunchModel


def test_first_launches_take_the_default():
    assert LaunchModel(first=16).rounds_per_launch() == 16


def test_launch_cost_is_amortized_to_the_overhead_asked():
    model = LaunchModel(overhead=0.05, responsive=1.0, most=10_000)
    model.learn(wall=100e-6 + 10 * 5e-6, device=10 * 5e-6, rounds=10)  # L = 100 us, R = 5 us
    k = model.rounds_per_launch()
    assert k == 380  # the smallest K with L / (L + K R) <= 5%: K >= L (1 - o) / (o R)
    assert 100e-6 / (100e-6 + k * 5e-6) <= 0.05 < 100e-6 / (100e-6 + (k - 1) * 5e-6)


def test_a_launch_returns_within_the_responsive_time_and_the_records():
    model = LaunchModel(overhead=0.001, responsive=0.1, most=256)
    model.learn(wall=1e-3 + 1e-3, device=1e-3, rounds=1)  # 1 ms rounds: at most 100 in 0.1 s
    assert model.rounds_per_launch() == 100
    model = LaunchModel(overhead=0.01, responsive=10.0, most=256)
    model.learn(wall=1e-3 + 1e-6, device=1e-6, rounds=1)
    assert model.rounds_per_launch() == 256


def test_cheap_launches_need_one_round_and_estimates_move_slowly():
    model = LaunchModel()
    model.learn(wall=1e-3, device=1e-3, rounds=1)  # no launch cost beyond the round
    assert model.rounds_per_launch() == 1
    model.learn(wall=2e-3, device=1e-3, rounds=1)
    assert model.launch == 0.2 * 1e-3 and model.rounds_per_launch() > 1
