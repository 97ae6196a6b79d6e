"""tasks.py: every generator's labels equal a brute-force checker's (small sizes, odd lengths, train and test
layouts, each task's shortest length), quantifier sequences are balanced, generation is a pure function of (seed,
stream, index), bad task settings are one clear message. cfg is imported by test_task_train_eval.py. CPU only."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import tasks


def cfg(task, **kw):
    return SimpleNamespace(**{**vars(tasks.TaskConfig()), "task": task, "seed": 3, **kw})


# ----------------------------------------------------------------------------------------------------------------
# Brute-force checkers: each recomputes a sequence's labels from its tokens (or reals) alone, reading left to right


def check_first(x, y, c):
    assert x[0] == 2 and set(x[1:].tolist()) <= {0, 1}
    return [-1] + [int(x[1])] * (len(x) - 1)


def check_recall(x, y, c):
    K, want, seen, queried = c.task_keys, [], {}, set()
    for tok in x.tolist():
        if tasks.FILL <= tok < tasks.FILL + K * K:  # a pair token "key:value"
            key, val = divmod(tok - tasks.FILL, K)
            seen.setdefault(key, []).append(val)
            want.append(-1)
        elif tasks.FILL + K * K <= tok < tasks.FILL + K * K + K:  # a query: its key is in exactly one earlier pair
            key = tok - tasks.FILL - K * K
            assert len(seen[key]) == 1 and key not in queried
            queried.add(key)
            want.append(tasks.FILL + K * K + K + seen[key][0])
        else:
            assert 0 <= tok < tasks.FILL and c.task_filler == "noise"
            want.append(-1)
    assert len(queried) == c.task_pairs and all(len(seen[k]) == 1 for k in queried)  # no distractor has its key
    return want


def check_mqar(x, y, c):
    D, K = c.task_pairs, c.task_keys
    store = {}
    for i in range(D):
        k, v = int(x[2 * i]) - tasks.FILL, int(x[2 * i + 1]) - tasks.FILL - K
        assert 0 <= k < K and 0 <= v < K and k not in store
        store[k] = v
    want = [-1] * (2 * D)
    for tok in x[2 * D:].tolist():
        want.append(tasks.FILL + K + store[tok - tasks.FILL] if tok >= tasks.FILL else -1)
    assert sum(w != -1 for w in want) == D  # every key queried once
    return want


def check_flipflop(x, y, c):
    want, last = [], None
    for i, tok in enumerate(x.tolist()):
        if i % 2:  # a bit
            assert tok in (3, 4)
            want.append(-1)
            continue
        if i == len(x) - 1:  # an odd length ends with a lone ignore
            assert tok == 2
            want.append(-1)
            continue
        if tok == 0:
            last = int(x[i + 1])
        want.append(last if tok == 1 else -1)
        if tok == 1:
            assert x[i + 1] == last  # a read repeats the last write
    assert x[0] == 0 and want[2 * (len(x) // 2) - 2] != -1  # starts with a write, ends with a read
    return want


def check_every(x, y, c):
    return [float(all(v > 0 for v in x[:t + 1, 0])) for t in range(len(x))]


def check_some(x, y, c):
    return [float(any(v > 0 for v in x[:t + 1, 0])) for t in range(len(x))]


def check_linear(x, y, c):
    xs, ys = x[0::2, 0], x[1::2, 1]
    assert np.all(x[0::2, 2] == 1) and np.all(x[1::2, 2] == 0)
    a = (ys[1] - ys[0]) / (xs[1] - xs[0]) if len(ys) > 1 else None  # the line through the first two points
    want = [math.nan] * len(x)
    for k in range(2, len(xs)):
        want[2 * k] = a * xs[k] + ys[0] - a * xs[0]
    return want


CHECKERS = {"first": check_first, "recall": check_recall, "mqar": check_mqar, "flipflop": check_flipflop,
            "every": check_every, "some": check_some, "linear": check_linear}


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_labels_hold_at_each_tasks_shortest_length(task):  # flipflop at 2 had a read before any write
    c = cfg(task)
    for L in (tasks.min_length(c), tasks.min_length(c) + 1):
        x, y = tasks.get_batch(c, 2, torch.arange(40), L, True)
        for xi, yi in zip(x.numpy(), y.numpy()):
            want = np.array(CHECKERS[task](xi, yi, c), dtype=np.float64)
            np.testing.assert_allclose(yi.astype(np.float64), want, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_every_task_has_a_checker():
    assert set(CHECKERS) == set(tasks.TASKS)


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
@pytest.mark.parametrize("L", [13, 31, 64])
@pytest.mark.parametrize("test", [False, True], ids=["train", "test"])
def test_labels_equal_the_brute_force_checker(task, L, test):
    c = cfg(task)
    variants = [("noise", {"task_filler": "noise"})] if task == "recall" else []
    for condition, over in [*tasks.TASKS[task].conditions, *variants]:
        cc = cfg(task, **over)
        x, y = tasks.get_batch(cc, 2, torch.arange(40), L, test)
        assert x.shape[:2] == y.shape == (40, L)
        for xi, yi in zip(x.numpy(), y.numpy()):
            want = np.array(CHECKERS[task](xi, yi, cc), dtype=np.float64)
            np.testing.assert_allclose(yi.astype(np.float64), want, rtol=1e-4, atol=1e-4, equal_nan=True)
    if task in ("recall", "mqar") and test:  # at test, the queries are the last task_pairs positions
        assert ((y[:, -c.task_pairs:] != -1).all() and (y[:, :-c.task_pairs] == -1).all())


def test_quantifier_sequences_are_balanced_and_flipflop_keeps_its_ignore_rate():
    x, y = tasks.get_batch(cfg("every"), 0, torch.arange(2000), 16)
    assert 0.45 < y[:, -1].mean() < 0.55  # half hold no counterexample
    x, _ = tasks.get_batch(cfg("flipflop", task_p_ignore=0.98), 0, torch.arange(200), 200)
    ops = x[:, 2:-2:2]  # between the forced first write and last read
    assert 0.97 < (ops == 2).float().mean() < 0.99


def test_each_test_condition_draws_what_its_name_says_whatever_the_run_trained_on():
    trained = cfg("flipflop", task_p_ignore=0.5)  # eval_tasks: the run's config, then the condition's overrides
    for name, over in tasks.TASKS["flipflop"].conditions:  # "p_i=0.8" had no override: it drew 0.5 here
        x, _ = tasks.get_batch(SimpleNamespace(**{**vars(trained), **over}), 2, torch.arange(200), 200)
        assert abs((x[:, 2:-2:2] == 2).float().mean() - float(name.split("=")[1])) < 0.02, name


def test_a_batch_is_a_pure_function_of_seed_stream_and_index_so_any_slice_is_the_same_data():
    c = cfg("recall")
    a = tasks.get_batch(c, 0, torch.arange(8), 33)
    assert all(torch.equal(u, v) for u, v in zip(a, tasks.get_batch(c, 0, torch.arange(8), 33)))
    part = tasks.get_batch(c, 0, torch.arange(4, 8), 33)  # a DDP rank's slice
    assert torch.equal(part[0], a[0][4:]) and torch.equal(part[1], a[1][4:])
    assert not torch.equal(tasks.get_batch(c, 1, torch.arange(8), 33)[0], a[0])  # val is another stream
    assert not torch.equal(tasks.get_batch(cfg("recall", seed=4), 0, torch.arange(8), 33)[0], a[0])


def test_bad_task_settings_are_one_clear_message():
    for c, words in ((cfg("nope"), "unknown task 'nope'"), (cfg("recall", task_pairs=16), "task_pairs=16"),
                     (cfg("flipflop", task_p_ignore=1.0), "task_p_ignore"), (cfg("recall", task_filler="x"), "pairs")):
        with pytest.raises(ValueError, match=words):
            tasks.check_config(c)


def test_training_layouts_put_items_and_queries_anywhere_so_every_distance_up_to_n_is_trained():
    L, D = 13, 4
    _, y = tasks.get_batch(cfg("recall"), 0, torch.arange(300), L)
    query = [np.flatnonzero(row >= 0) for row in y.numpy()]
    assert min(q.min() for q in query) == 1 and max(q.max() for q in query) == L - 1  # an item before each
    x, y = tasks.get_batch(cfg("mqar"), 0, torch.arange(300), L)  # queries anywhere after the 2 D pair tokens
    assert {int(i) for row in y.numpy() for i in np.flatnonzero(row >= 0)} == set(range(2 * D, L))
    K = cfg("recall").task_keys
    x, _ = tasks.get_batch(cfg("recall"), 0, torch.arange(300), L, True)  # test: items anywhere before the queries
    items = {i for row in x.tolist() for i in range(L - D)  # the pair tokens of queried keys
             if (row[i] - tasks.FILL) // K in {q - tasks.FILL - K * K for q in row[L - D:]}}
    assert items == set(range(L - D))


def test_flipflop_writes_and_reads_share_the_rest_equally():
    x, _ = tasks.get_batch(cfg("flipflop", task_p_ignore=0.1), 0, torch.arange(200), 200)
    ops = x[:, 2:-2:2]
    assert abs((ops == 0).float().mean() - 0.45) < 0.02 and abs((ops == 1).float().mean() - 0.45) < 0.02


def test_target_positions_are_where_the_answer_is_read_from():
    x, _ = tasks.get_batch(cfg("first"), 2, torch.arange(4), 9)
    assert tasks.target_positions(cfg("first"), x).tolist() == [1] * 4  # the first bit, after <bos>
    c = cfg("recall")
    x, _ = tasks.get_batch(c, 2, torch.arange(20), 17, True)
    K = c.task_keys
    for row, t in zip(x.tolist(), tasks.target_positions(c, x).tolist()):  # the last query's key's pair token
        assert (row[t] - tasks.FILL) // K == row[-1] - tasks.FILL - K * K and row[t] < tasks.FILL + K * K
    for task, bad in (("every", lambda v: v < 0), ("some", lambda v: v > 0)):
        x, _ = tasks.get_batch(cfg(task), 2, torch.arange(20), 11)
        for row, t in zip(x[..., 0].tolist(), tasks.target_positions(cfg(task), x).tolist()):  # the witness
            hits = [i for i, v in enumerate(row) if bad(v)]
            assert t == (hits[0] if hits else -1)


def test_a_test_condition_setting_an_option_the_task_does_not_read_or_its_vocabulary_is_refused_at_definition():
    # eval_tasks merges a condition's overrides unchecked: an unread one ran the trained setting under its name
    with pytest.raises(ValueError, match="test condition 'sigma=3' sets task_sigma, not all read by the task"):
        tasks.Task(tasks.first, lambda c: 3, conditions=(("sigma=3", {"task_sigma": 3.0}),))
    with pytest.raises(ValueError, match="test condition 'keys=32' changes the vocabulary"):
        tasks.Task(tasks.mqar, lambda c: tasks.FILL + 2 * c.task_keys, conditions=(("keys=32", {"task_keys": 32}),),
                   reads=("task_pairs", "task_keys"))


def test_a_task_whose_loss_and_inputs_disagree_is_refused_at_definition():
    # n_in=1 with "ce" trained BCE (RealGPT) and its eval failed; "bce" on tokens trained cross-entropy (GPT)
    for loss, n_in in (("ce", 1), ("bce", 0), ("mse", 0), ("l1", 1)):
        with pytest.raises(ValueError, match=f"task 'first': loss='{loss}' with n_in={n_in}"):
            tasks.Task(tasks.first, lambda c: 3, loss, n_in)


def test_a_count_option_below_1_is_one_clear_message_for_any_task_that_reads_it(monkeypatch):
    # only mqar and recall had their task_pairs checked: a task added later met 0 deep in its sampler
    def pairs(L, rng, c, test):  # task_pairs=0: a ZeroDivisionError mid-run
        return np.zeros(L, np.int64), np.full(L, L // c.task_pairs)
    monkeypatch.setitem(tasks.TASKS, "induction", tasks.Task(pairs, lambda c: 3, reads=("task_pairs",)))
    tasks.check_config(cfg("induction", task_pairs=2))
    with pytest.raises(ValueError, match=r"task_pairs=0 must be >= 1 \(a count\)"):
        tasks.check_config(cfg("induction", task_pairs=0))


def test_a_token_id_past_the_tasks_vocabulary_is_one_clear_error(monkeypatch):
    # the batch had gone to the embedding unchecked: an IndexError deep in torch, naming no task
    def off_by_one(L, rng, c, test):
        return np.arange(L), np.full(L, -1)
    monkeypatch.setitem(tasks.TASKS, "induction", tasks.Task(off_by_one, lambda c: 4))
    tasks.get_batch(cfg("induction"), 0, torch.arange(2), 4)
    with pytest.raises(ValueError, match=r"task 'induction' drew token ids 0\.\.4 at length 5; its vocabulary holds "
                                         r"0\.\.3"):
        tasks.get_batch(cfg("induction"), 0, torch.arange(2), 5)


def test_the_module_docstring_says_where_a_new_task_is_registered():
    doc = tasks.__doc__.split("Adding a task")[-1]  # every place, each one that exists today
    from lib import synthetic_report, synthetic_suite
    for owner, names in ((tasks, ("TaskConfig", "check_config", "TASKS", "min_length", "target_positions", "TARGETS")),
                         (synthetic_suite, ("SUITE",)), (synthetic_report, ("PRIMARY",))):
        assert all(name in doc and hasattr(owner, name) for name in names), names
    assert "configs/tasks/<name>.py" in doc and "CHECKERS" in doc and CHECKERS
