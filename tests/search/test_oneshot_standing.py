"""`oneshot.standing`: the file a training supernet rewrites after every epoch, and the words the
waiting driver's progress line takes from it (epochs done, minutes left; nothing from another run)."""

from __future__ import annotations

import json
import time

from petl_nas.search.oneshot.standing import describe, standing_path, write


def test_the_time_left_comes_from_the_epochs_done_in_this_run(tmp_path):
    path = standing_path(tmp_path / "oneshot-0.pt")
    assert path.endswith("oneshot-0.pt.standing.json")
    assert describe(path, since=0) is None  # nothing written yet
    began = time.time() - 180
    write(path, epoch=3, epochs=10, first_epoch=0, began=began)
    at = json.loads(open(path).read())["at"]
    assert began + 180 <= at <= time.time()  # stamped when written
    # 3 epochs in 180 s: 60 s each, 7 to go, 60 s of them already run since the file was written
    assert describe(path, since=began, now=at + 60) == "epoch 3 of 10 done, about 6 min left"
    with open(path, "w") as f:  # its time is when it was written
        json.dump({"epoch": 3, "epochs": 10, "first_epoch": 0, "began": 1000.0, "at": 1180.0}, f)
    assert describe(path, since=0, now=1240.0) == "epoch 3 of 10 done, about 6 min left"
    assert describe(path, since=1200.0) is None  # written before this run began: not its
    # an epoch running far past the others' 60 s counts as at least that long: the estimate grows, never
    # running down to "1 min" to jump back up when it ends: (180 + 3820) / 4 = 1000 s an epoch, 6 more to go
    assert describe(path, since=0, now=5000.0) == "epoch 3 of 10 done, about 100 min left"


def test_the_estimate_does_not_jump_when_an_epoch_outlasts_the_first(tmp_path):
    """A fake clock over a run whose first epoch took 1 min and whose later ones take 5: the minutes
    left never fall to nothing and jump back (the line said "about 1 min left", then "about 37")."""

    def said(state: dict, now: float) -> int:
        with open(path, "w") as f:
            json.dump(state, f)
        return int(describe(path, since=0, now=now).split("about ")[1].split()[0])

    path = tmp_path / "s.json"
    one = {"epoch": 1, "epochs": 10, "first_epoch": 0, "began": 0.0, "first_done": 60.0, "at": 60.0}
    during = [said(one, 60.0 + s) for s in range(0, 301, 30)]  # epoch 2 runs for 5 min
    after = said({**one, "epoch": 2, "at": 360.0}, 360.0)
    assert min(during) >= 4 and after <= max(during) + 15 and during[-1] >= 10
    slow_first = {"epoch": 2, "epochs": 10, "first_epoch": 0, "began": 0.0, "first_done": 600.0, "at": 660.0}
    assert said(slow_first, 660.0) == 8  # a 10-min first epoch (warm-up) is not extrapolated: 8 x 1 min


def test_a_resumed_run_times_only_the_epochs_it_trained(tmp_path):
    path = tmp_path / "s.json"
    with open(path, "w") as f:  # went on from epoch 4: 2 epochs in 100 s, 4 more to go
        json.dump({"epoch": 6, "epochs": 10, "first_epoch": 4, "began": 0.0, "at": 100.0}, f)
    assert describe(path, since=0, now=100.0) == "epoch 6 of 10 done, about 3 min left"
    with open(path, "w") as f:  # the epoch it resumed from is not one it trained
        json.dump({"epoch": 4, "epochs": 10, "first_epoch": 4, "began": 0.0, "at": 100.0}, f)
    assert describe(path, since=0) is None


def test_the_last_epoch_says_what_comes_after_it_and_a_bad_file_says_nothing(tmp_path):
    path = tmp_path / "s.json"
    with open(path, "w") as f:  # 2.5 epochs: the half epoch is a third save
        json.dump({"epoch": 3, "epochs": 2.5, "first_epoch": 0, "began": 0.0, "at": 30.0}, f)
    assert describe(path, since=0) == "epoch 3 of 2.5 done, scoring it and reading off its proposals"
    path.write_text("{not json")
    assert describe(path, since=0) is None
    path.write_text(json.dumps({"epoch": 1}))
    assert describe(path, since=0) is None
