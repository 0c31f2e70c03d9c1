"""What a fault-tolerant replica's Manager costs a step outside its collectives: the quorum it
already holds is read without torch.profiler's record (five reads a step), and it heartbeats to the
lighthouse ten times a timeout instead of torchft's fixed 100 ms."""

from __future__ import annotations

import concurrent.futures
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from disttrain_trainer.modes.data import ft_replica
from ports import free_port  # tests/ports.py: each xdist worker's own slice
from torchft.coordination import LighthouseServer
from torchft.process_group import ProcessGroupGloo


def test_the_heartbeat_comes_ten_times_a_timeout_and_at_least_once_a_second() -> None:
    assert ft_replica.heartbeat_interval(5.0) == timedelta(milliseconds=500)
    assert ft_replica.heartbeat_interval(3.0) == timedelta(milliseconds=300)
    assert ft_replica.heartbeat_interval(1.0) == timedelta(milliseconds=100)  # the minimum timeout: torchft's default
    assert ft_replica.heartbeat_interval(600.0) == timedelta(seconds=1)


def _manager(lighthouse: str, store: dist.TCPStore) -> ft_replica._ResolvedQuorumManager:
    return ft_replica._ResolvedQuorumManager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), load_state_dict=lambda _: None, state_dict=dict,
        min_replica_size=1, use_async_quorum=False, timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=10), connect_timeout=timedelta(seconds=10), rank=0, world_size=1,
        store_addr="127.0.0.1", store_port=store.port, lighthouse_addr=lighthouse, replica_id="replica_0",
        hostname="127.0.0.1", init_sync=False, heartbeat_interval=ft_replica.heartbeat_interval(1.0),
    )  # fmt: skip


class _FailsWhenWaitedFor(concurrent.futures.Future[None]):
    """A quorum not formed yet when it is asked for, which then fails."""

    def result(self, timeout: float | None = None) -> None:
        if not self.done():
            self.set_exception(TimeoutError("no quorum from the lighthouse"))
        return super().result(timeout)


def test_a_held_quorum_is_read_without_the_profilers_record_and_a_failed_one_still_raises() -> None:
    port = free_port()
    lighthouse = LighthouseServer(bind=f"[::]:{port}", min_replicas=1)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = _manager(f"http://127.0.0.1:{port}", store)
    try:
        manager.start_quorum()
        with torch.profiler.profile() as prof:
            assert manager.num_participants() == 1
            assert manager.participating_rank() == 0
            assert manager.should_commit()
        names = {e.name for e in prof.events()}
        assert "torchft::manager::should_commit" in names  # (the profiler saw torchft's records)
        assert "torchft::manager::wait_quorum" not in names
        assert manager.current_step() == 1

        # A quorum still being formed is waited for by torchft's own wait (recorded); one that
        # failed raises its error on every read, as torchft's does.
        manager._quorum_future = _FailsWhenWaitedFor()
        with torch.profiler.profile() as prof, pytest.raises(TimeoutError, match="no quorum"):
            manager.wait_quorum()
        assert "torchft::manager::wait_quorum" in {e.name for e in prof.events()}
        with pytest.raises(TimeoutError, match="no quorum"):
            manager.num_participants()
    finally:
        manager.shutdown(wait=False)
        lighthouse.shutdown()
