"""`oneshot.standing`: the file a training supernet rewrites after every epoch, and the words the
waiting driver's progress line takes from it (epochs done, minutes left; nothing from another run)."""

from __future__ import annotations

import json
import time

from petl_nas.search.oneshot.standing import describe, standing_path, write


def test_the_time_left_comes_from_the_epochs_done_in_this_run(tmp_path):
    path = standing_path(tmp_path / "oneshot-0.pt")
    assert path.endswith("oneshot-0.pt.standing.json")
    assert describe(path, since=0) is None                              # nothing written yet
    began = time.time() - 180
    write(path, epoch=3, epochs=10, first_epoch=0, began=began)
    at = json.loads(open(path).read())["at"]
    assert began + 180 <= at <= time.time()                             # stamped when written
    # 3 epochs in 180 s: 60 s each, 7 to go, 60 s of them already run since the file was written
    assert describe(path, since=began, now=at + 60) == "epoch 3 of 10 done, about 6 min left"
    with open(path, "w") as f:                                          # its time is when it was written
        json.dump({"epoch": 3, "epochs": 10, "first_epoch": 0, "began": 1000.0, "at": 1180.0}, f)
    assert describe(path, since=0, now=1240.0) == "epoch 3 of 10 done, about 6 min left"
    assert describe(path, since=1200.0) is None                          # written before this run began: not its
    assert describe(path, since=0, now=5000.0) == "epoch 3 of 10 done, about 1 min left"   # never "0 min"


def test_a_resumed_run_times_only_the_epochs_it_trained(tmp_path):
    path = tmp_path / "s.json"
    with open(path, "w") as f:                      # went on from epoch 4: 2 epochs in 100 s, 4 more to go
        json.dump({"epoch": 6, "epochs": 10, "first_epoch": 4, "began": 0.0, "at": 100.0}, f)
    assert describe(path, since=0, now=100.0) == "epoch 6 of 10 done, about 3 min left"
    with open(path, "w") as f:                      # the epoch it resumed from is not one it trained
        json.dump({"epoch": 4, "epochs": 10, "first_epoch": 4, "began": 0.0, "at": 100.0}, f)
    assert describe(path, since=0) is None


def test_the_last_epoch_says_what_comes_after_it_and_a_bad_file_says_nothing(tmp_path):
    path = tmp_path / "s.json"
    with open(path, "w") as f:                      # 2.5 epochs: the half epoch is a third save
        json.dump({"epoch": 3, "epochs": 2.5, "first_epoch": 0, "began": 0.0, "at": 30.0}, f)
    assert describe(path, since=0) == "epoch 3 of 2.5 done, scoring it and reading off its proposals"
    path.write_text("{not json")
    assert describe(path, since=0) is None
    path.write_text(json.dumps({"epoch": 1}))
    assert describe(path, since=0) is None
