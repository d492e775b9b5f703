"""The join killed with -9 at many points - by failpoints at exact stages of a batch (applied
in memory, emitted, changelog written, local state half written) and from outside at seeded
random times, mostly while it replays what the last crash left - gives every decision the
update a run without faults gives it: the same status, reward and reward count in every copy
(a copy emitted again after a crash is the same update; the learner drops it by event_id).
"""

from __future__ import annotations

import math
import random
import signal
import time


from streams.join import Failpoint
from streams.topics import ensure_topics
from tests import join_helpers as H
from tests.test_join_worker import Workload, _domains, _explain


def crash_plan(seed: int, n: int) -> list[tuple[str, float]]:
    """(failpoint stage, the pass that kills) or ("wall", seconds after the start)."""
    rng = random.Random(seed)
    plan = [(stage, rng.randint(1, 6)) for stage in Failpoint.STAGES]  # each stage at least once
    plan += [("wall", round(rng.uniform(1.5, 5.0), 2)) for _ in range(n - len(plan))]
    rng.shuffle(plan)
    return plan


def test_kill_9_at_many_points_every_decision_joins_as_without_faults(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    config_path = H.write_config(tmp_path / "join.json", _domains())
    env = H.process_env(kafka, topics, tmp_path / "state", H.free_port())
    log = tmp_path / "join.log"
    work = Workload(kafka, topics, 12_000, seed=21, rate=1000.0)
    plan = crash_plan(seed=21, n=9)
    killed = []
    produced = work.run_in_thread()
    for stage, when in plan:
        worker = H.join_process(config_path, {**env, **({} if stage == "wall" else {"BANDITSTREAM_FAILPOINT": f"{stage}:{when}"})}, log)
        started = time.monotonic()
        limit = when if stage == "wall" else 20.0  # a failpoint not reached by then: killed from outside
        while worker.poll() is None and time.monotonic() - started < limit:
            time.sleep(0.05)
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
        code = worker.wait(10)
        assert code == -signal.SIGKILL, f"the join exited {code} by itself: {log.read_text()[-3000:]}"
        killed.append((stage, when, round(time.monotonic() - started, 1)))
    produced.join()
    assert work.error is None, f"the workload could not produce: {work.error!r}"
    failpoints = log.read_text().count("failpoint")
    assert failpoints >= len(Failpoint.STAGES), killed  # each exact stage was hit, not only outside kills

    worker = H.join_process(config_path, env, log)
    try:
        updates = H.read_topic(kafka, topics.updates, "update", until=H.every_event(work.decisions), idle_s=3,
                               timeout_s=240)
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(60)
    assert code == 0, log.read_text()[-3000:]

    assert {u["event_id"] for _, u in updates} == set(work.decisions), killed
    wrong = sorted({
        u["event_id"] for _, u in updates
        if (u["join_status"], u["reward_count"]) != (work.expected(u["event_id"])["join_status"],
                                                      work.expected(u["event_id"])["reward_count"])
        or not math.isclose(u["reward"], work.expected(u["event_id"])["reward"], abs_tol=1e-9)
    })  # fmt: skip
    assert not wrong, f"after kills {killed}: " + _explain(kafka, topics, work, updates, wrong)


def test_changelog_records_a_standby_took_from_the_consumer_survive_the_end_of_recovery(kafka, topics, tmp_path):
    """faust hands the changelog records its consumer fetched to its recovery through a queue,
    which it emptied whenever flow control resumed. A restarted join whose predecessor's group
    member had not yet timed out got half the partitions as standbys; their changelogs were
    being read when the recovery completed and resumed flow control: the queued records were
    dropped while the consumer read on, the standby applied what followed, and its persisted
    offset passed the hole, which no later recovery reads. Promoted to active once the dead
    member was gone, a partition had the newer ``replay_from`` but not the "X" done markers
    written with or before it: a decision read again (at or past the decisions' replay_from)
    whose early reward was not (before the rewards') was finalised afresh as ``default`` (the
    kill test: 949 of one partition's 3,054 markers missing, 2 early decisions learned as
    default). faust's recovery skips a record whose offset it has seen, so one kept across a
    rebalance or a resume is harmless; a dropped one is lost."""
    from streams.join import JoinWorker

    worker = JoinWorker(H.settings(kafka, topics, tmp_path / "state").worker_config())
    app, queue = worker.app, worker.app.tables.changelog_queue
    taken = [("changelog", 2, offset) for offset in range(108, 3453)]  # what the standby's consumer handed over
    for record in taken:
        queue.put_nowait(record)
    app.flow_control.suspend()  # a rebalance: faust's _on_partitions_revoked
    app.flow_control.clear()
    app.flow_control.resume()  # its recovery completed: Recovery.on_recovery_completed
    assert [queue.get_nowait() for _ in range(queue.qsize())] == taken
