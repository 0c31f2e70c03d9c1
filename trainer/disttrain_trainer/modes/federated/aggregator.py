"""The aggregator: a grpc.aio service and the round state machine (one process).

Each round: sample from all `clients` (sampling.py: keyed draws nobody else can predict;
clientsPerRound of them, or each at rate clientsPerRound / clients with central DP), stream them
the global model, collect updates until all answered or roundTimeoutSeconds passed (a
sampled client that did not answer, connected or not, is dropped), aggregate when at least
minAnsweredClients answered (the strategy's rule), else abandon the attempt and sample the round
again. With central DP every attempt is published (the clipped, noised mean, whoever answered:
see privacy.py) and only the released values leave the aggregator (round_report.py). A client's
sample weight is capped at its own partition's size. After each round: server step, evaluation
of the global model, checkpoint (atomic), metrics. Every call
passes the gate (serving.py): a token made with the calling client's own
credential, bound to this process's session and the round it belongs to; every
refused call or update is logged with its reason and counted, and leaves the
global model untouched; so does every abandoned round attempt
(`disttrain_federated_rounds_abandoned_total{reason}`).
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch
from disttrain_api.model import FederatedSpec

from ...checkpoints import directory as cdir
from ...checkpoints import whole as ckpt
from ...checkpoints.fence import Writer
from ...tensor_transport import auth, codec, gate
from ...tensor_transport.protos import tensor_transport_pb2 as pb
from ...tensor_transport.protos import tensor_transport_pb2_grpc as pbg
from . import checks, compression
from .privacy import PrivacyAccountant
from .round_report import round_record, round_times, run_summary, without_client_ids
from .rounds import Abandoned, RoundAttempt, SecureStage, wait_event
from .sampling import ClientSampler
from .secure_server import Refused, SecureStages
from .settings import client_ids
from .strategy import ServerStep, WeightedMean, make_aggregation

KEEP_CHECKPOINTS = 2


class Aggregator(SecureStages, pbg.FederatedServicer):
    def __init__(
        self,
        *,
        fed: FederatedSpec,
        model: dict[str, torch.Tensor],
        key: bytes,  # the server key every client credential derives from
        metrics: Any,  # FedMetrics
        evaluate: Callable[[dict[str, torch.Tensor]], float] | None = None,
        checkpoint_dir: Path | None = None,
        writer: Writer | None = None,  # who writes its checkpoints (checkpoints/fence.py)
        # Client id -> the rows of its partition (partition.py): the most samples it may declare.
        # None: no per-client cap (tests that hand-make updates).
        client_rows: Mapping[str, int] | None = None,
        # The sampling salt (sampling.py): None draws one from the OS, as a job always does; runs
        # compared on the very same samples (tests, benchmarks) share one, and the server key.
        sampling_salt: bytes | None = None,
        log: Callable[[str], None] = lambda s: print(s, flush=True),
        # Writes the final global model (state, rounds) and returns the summary's `export` entry.
        export: Callable[[dict[str, torch.Tensor], int], dict[str, Any]] | None = None,
    ):
        self.fed = fed
        # Central DP: only noised values and their budget leave this process (README, Federated mode).
        self.private = fed.privacy is not None
        if self.private and not metrics.private:
            raise ValueError("central DP: the aggregator's FedMetrics must be made with private=True, "
                             "so no per-client series is exported")  # fmt: skip
        # Only floating-point entries are trained; integer buffers ride along unchanged.
        self.model = {n: t.detach().clone() for n, t in model.items()}
        self.shapes = [(n, t.shape) for n, t in self.model.items() if t.is_floating_point()]
        self.numel = sum(math.prod(s) for _, s in self.shapes)
        self.keyring = auth.Keyring(key, client_ids(fed.clients))
        # Tokens name the session: one of an earlier process (whose round numbers repeat after a
        # restart from the checkpoint) is refused here.
        self.session = secrets.token_hex(8)
        self.metrics = metrics
        self.evaluate = evaluate
        self.checkpoint_dir = checkpoint_dir
        self.writer = writer or Writer()
        self.client_rows = dict(client_rows) if client_rows is not None else None
        self.log = without_client_ids(log) if self.private else log
        self.export = export
        self.known = set(client_ids(fed.clients))
        self.sampler = ClientSampler(key, sorted(self.known), salt=sampling_salt)
        self.server = ServerStep(fed.strategy, fed.server_learning_rate)
        self.privacy = (PrivacyAccountant(fed.privacy, clients=fed.clients, clients_per_round=fed.clients_per_round)
                        if fed.privacy is not None else None)  # fmt: skip
        self.round = 0  # rounds completed
        self.attempts = 0
        self.history: list[dict[str, Any]] = []
        self.seen: set[str] = set()  # clients that called this process
        self.told_done: set[str] = set()
        self.current: RoundAttempt | None = None
        self.done = False
        self.cond = asyncio.Condition()
        self.resumed_from: int | None = None
        self.started = time.perf_counter()
        # The job's summary, fixed when the last round closes; clients get it with "done" so the
        # operator finds it in client 0's termination message (the aggregator is a Deployment pod).
        self.final_summary: dict[str, Any] | None = None
        self._spare: list[np.ndarray] = []  # decode buffers to reuse (see codec.Decoder)
        self._sums: dict[str, torch.Tensor] | None = None  # the last round's running sums, reused

    # ------------------------------------------------------------- checkpoint

    def state(self) -> dict[str, Any]:
        return {"round": self.round, "attempts": self.attempts, "model": self.model,
                "server": self.server.state_dict(), "history": self.history, "sampling": self.sampler.state_dict(),
                "privacy": self.privacy.state_dict() if self.privacy is not None else None}  # fmt: skip

    def restore(self) -> None:
        if self.checkpoint_dir is None:
            return
        # Claim the directory first: an aggregator pod replaced while it still ran (a lost node)
        # must not publish or prune any more (checkpoints/fence.py).
        cdir.take_over(self.checkpoint_dir, self.writer)
        found = ckpt.load_latest(self.checkpoint_dir)
        if found is None:
            return
        _, state = found
        self.model = state["model"]
        self.round = int(state["round"])
        self.attempts = int(state["attempts"])
        self.server.load_state_dict(state["server"])
        self.history = list(state["history"])
        if "sampling" in state:  # the same salt: the next attempt samples what the interrupted one did
            self.sampler.load_state_dict(state["sampling"])
        if self.privacy is not None:
            # The budget is spent by every published round, before the restart too.
            self.privacy.load_state_dict(state.get("privacy") or {})
        self.resumed_from = self.round
        self.metrics.step.set(self.round)
        self.metrics.round.set(self.round)
        self.metrics.last_ckpt.set(self.round)
        self.log(f"aggregator: resumed after round {self.round} from {self.checkpoint_dir}")

    def _save(self) -> None:
        assert self.checkpoint_dir is not None
        ckpt.save(self.checkpoint_dir, self.state(), self.round, keep=KEEP_CHECKPOINTS, world_size=1)

    # ------------------------------------------------------------- helpers

    def _refuse(self, reason: str, who: str, message: str) -> None:
        self.metrics.reject(reason)
        self.log(f"aggregator: refused {who}: {reason}: {message}")

    async def _client(self, context: grpc.aio.ServicerContext) -> str:
        """The client the gate verified for this call (serving.build_server puts it in front)."""
        cid = gate.verified_identity()
        if cid is None:
            why = "the call did not pass the aggregator's gate"
            self._refuse(auth.NO_TOKEN, context.peer(), why)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
        assert cid is not None
        return cid

    def _sampled(self, cid: str, round_no: int, attempt: int) -> RoundAttempt:
        ra = self.current
        if ra is None or ra.round != round_no or ra.attempt != attempt or not ra.open:
            have = f"{ra.round}.{ra.attempt}" if ra is not None and ra.open else "none open"
            raise Refused("stale", f"names round {round_no}.{attempt}; the open round is {have}")
        if cid not in ra.sampled:
            raise Refused("not_sampled", f"not sampled in round {ra.round_id}")
        return ra

    def _weight(self, cid: str, declared: float, *, masked: bool) -> float:
        """The sample weight the client's update counts with: what it declared, at most its partition's
        rows (a masked input cannot be reweighted: it is refused instead)."""
        if not (math.isfinite(declared) and declared > 0):
            raise Refused("bad_samples", f"num_samples {declared} must be a positive number")
        rows = self.client_rows.get(cid) if self.client_rows is not None else None
        if rows is None or declared <= rows or self.private:  # central DP weighs every update equally
            return declared
        if masked:
            raise Refused("bad_samples", f"num_samples {declared:g} exceeds the {rows} rows of {cid}'s partition; "
                                         "a masked input cannot be reweighted")  # fmt: skip
        self.log(f"aggregator: {cid} declared {declared:g} samples, its partition holds {rows}: weighted {rows}")
        return float(rows)

    def sample(self, round_no: int, attempt: int) -> list[str]:
        """The clients a round attempt samples (connected or not: one that does not answer is dropped)."""
        return self.sampler.for_round(self.fed, round_no, attempt)

    def _model_chunks(self, round_no: int, attempt: int) -> list[pb.Chunk]:
        tensors = [(n, self.model[n]) for n, _ in self.shapes]
        header = codec.make_header(kind="train", round=round_no, tensors=tensors, scalars={"attempt": attempt})
        return list(codec.encode(header, tensors))

    # ------------------------------------------------------------- RPCs

    async def Join(self, request: pb.JoinRequest, context: grpc.aio.ServicerContext) -> pb.JoinReply:
        cid = await self._client(context)
        async with self.cond:
            self.seen.add(cid)
            self.cond.notify_all()
        return pb.JoinReply(round=self.round, rounds=self.fed.rounds, session=self.session)

    async def GetTask(self, request: pb.TaskRequest, context: grpc.aio.ServicerContext):  # noqa: ANN201
        cid = await self._client(context)
        async with self.cond:
            self.seen.add(cid)
            self.cond.notify_all()
            await self.cond.wait_for(
                lambda: self.done or (self.current is not None and self.current.open
                                      and cid in self.current.sampled and cid not in self.current.served)
            )  # fmt: skip
            ra = None if self.done else self.current
            if ra is not None:
                ra.served.add(cid)
        if ra is None:
            self.told_done.add(cid)
            summary = json.dumps(self.final_summary or self.summary())
            yield pb.Chunk(header=pb.StreamHeader(kind="done", round=self.round, attrs={"summary": summary}))
            return
        for chunk in ra.model_chunks:
            self.metrics.bytes_down.inc(len(chunk.data))
            yield chunk

    async def PushUpdate(self, request_iterator, context: grpc.aio.ServicerContext) -> pb.PushReply:  # noqa: ANN001
        cid = await self._client(context)
        kind = "masked" if self.fed.secure_aggregation else "update"
        limit = (self.numel + 1) * 8 if kind == "masked" else compression.wire_limit(self.fed.compression, self.shapes)
        try:
            try:
                got = await codec.decode_stream(request_iterator, limit, self._spare)
            except codec.StreamError as e:
                raise Refused(e.reason, str(e)) from None
            h = got.header
            if h.kind != kind:
                raise Refused("bad_stream", f"kind {h.kind!r}, expected {kind!r}")
            ra = self._sampled(cid, h.round, int(h.scalars.get("attempt", -1)))
            if cid in ra.answered:
                raise Refused("duplicate", f"already answered round {ra.round_id}")
            n = self._weight(cid, float(h.scalars.get("num_samples", 0.0)), masked=kind == "masked")
            if kind == "masked":
                self._add_masked(cid, ra, got.tensors, n)
            else:
                try:
                    update = compression.decode(self.fed.compression, got.tensors, dict(h.scalars), self.shapes)
                except compression.DecodeError as e:
                    raise Refused(e.reason, str(e)) from None
                # With central DP nothing is refused for its content: a refusal is an un-noised
                # fact about one client's update that would leave the aggregator (counted and
                # logged). The clip bounds every update instead, and maps a non-finite one to zero.
                bad = None if self.private else checks.problem(update, self.fed.max_update_norm)
                if bad is not None:
                    raise Refused(*bad)
                assert ra.total is not None
                ra.total.add(cid, update, n)
                if got.buffer is not None and len(self._spare) < 2 and self.fed.compression == "none":
                    self._spare.append(got.buffer)  # summed: its bytes are no longer needed
            ra.answered.add(cid)
            ra.bytes_up += got.wire_bytes
            ra.samples += n
            ra.client_compute_s[cid] = float(h.scalars.get("compute_s", 0.0))
            ra.client_comm_s[cid] = float(h.scalars.get("comm_s", 0.0))
            ra.client_data_s[cid] = float(h.scalars.get("data_s", 0.0))
            ra.client_loss[cid] = float(h.scalars.get("loss", float("nan")))
            self.metrics.bytes_up.inc(got.wire_bytes)
            if len(ra.answered) >= ra.expected_answers():
                ra.all_answered.set()
            return pb.PushReply(accepted=True)
        except Refused as e:
            self._refuse(e.reason, cid, str(e))
            return pb.PushReply(accepted=False, reason=f"{e.reason}: {e}")

    # ------------------------------------------------------------- rounds

    async def run(self) -> None:
        """Play rounds until `rounds` are done; then tell waiting clients to stop."""
        fed = self.fed
        while self.round < fed.rounds:
            if self.round == 0 or not self.history:
                await self._wait_registered(float(fed.round_timeout_seconds))
            async with self.cond:
                # Not before a round could be published: enough clients called this process.
                await self.cond.wait_for(lambda: len(self.seen) >= fed.min_answered_clients)
                self.attempts += 1
                r = self.round + 1
                # From all clients, registered or not: one that is not connected counts as sampled
                # and dropped, as the accountant assumes; it may still connect and answer in time.
                sampled = self.sample(r, self.attempts)
                secure = SecureStage(min_answered=fed.min_answered_clients) if fed.secure_aggregation else None
                ra = RoundAttempt(
                    round=r, attempt=self.attempts, sampled=sampled,
                    model_chunks=self._model_chunks(r, self.attempts),
                    deadline=time.monotonic() + fed.round_timeout_seconds,
                    total=None if secure else make_aggregation(fed, self.shapes, reuse=self._sums), secure=secure,
                )  # fmt: skip
                if not sampled:  # a Poisson sample may be empty: nothing to wait for
                    ra.all_answered.set()
                self.current = ra
                self.cond.notify_all()
            self.metrics.sampled.inc(len(sampled))
            try:
                mean = await (self._plain_round(ra) if secure is None else self._secure_round(ra))
            except Abandoned as e:
                if secure is not None:
                    secure.abort()  # releases clients blocked in a stage
                mean = None
                self._abandon(ra, e)
            ra.open = False
            dropped = len(sampled) - len(ra.answered)
            self.metrics.dropped.inc(dropped)
            if mean is None:
                continue
            await self._finish_round(ra, mean, dropped)
        final = self.summary()
        if self.export is not None:  # before "done" goes out: the clients' summary names the export
            final["export"] = self.export(self.model, self.round)
        self.final_summary = final
        async with self.cond:
            self.done = True
            self.current = None
            self.cond.notify_all()

    def summary(self) -> dict[str, Any]:
        """The run's summary in the keys every mode reports (a round counts as a step)."""
        return run_summary(self.history, rounds=self.round, attempts=self.attempts,
                           privacy=self.privacy.report() if self.privacy is not None else None,
                           resumed_from=self.resumed_from, wall_s=time.perf_counter() - self.started)  # fmt: skip

    async def _wait_registered(self, timeout: float) -> None:
        """At start: give every client up to a round's timeout to register, so the first sample sees all."""
        async with self.cond:
            try:
                await asyncio.wait_for(self.cond.wait_for(lambda: self.seen >= self.known), timeout)
            except TimeoutError:
                pass

    def _abandon(self, ra: RoundAttempt, e: Abandoned) -> None:
        """The attempt is not published: counted by reason, logged; the round is sampled again."""
        self.metrics.abandon(e.reason)
        self.metrics.retries.inc()
        who = "" if self.private else f"{len(ra.answered)}/{len(ra.sampled)} answered; "
        self.log(f"aggregator: round {ra.round_id} abandoned ({e.reason}): {e}; {who}the model is unchanged, "
                 "sampling the round again")  # fmt: skip

    async def _plain_round(self, ra: RoundAttempt) -> dict[str, torch.Tensor]:
        await wait_event(ra.all_answered, ra.remaining())
        ra.open = False
        # Central DP publishes every attempt: abandoning one for too few answers would make which
        # attempts count depend on who was sampled, which the accountant does not model.
        if len(ra.answered) < self.fed.min_answered_clients and not self.private:
            raise Abandoned("too_few_answers", f"{len(ra.answered)} updates arrived; minAnsweredClients is "
                                               f"{self.fed.min_answered_clients}")  # fmt: skip
        assert ra.total is not None
        try:
            mean = ra.total.result()
        except ValueError as e:
            raise Abandoned("too_few_answers", f"{self.fed.strategy}: {e}") from None
        if isinstance(ra.total, WeightedMean):
            self._sums = ra.total.sum.sums
        return mean

    async def _finish_round(self, ra: RoundAttempt, mean: dict[str, torch.Tensor], dropped: int) -> None:
        self.server.apply(self.model, mean)
        self.round = ra.round
        if self.privacy is not None:
            self.privacy.step()  # one step of the accountant per published round
        accuracy = await asyncio.to_thread(self.evaluate, self.model) if self.evaluate else None
        round_s = time.monotonic() - ra.started
        answered = sorted(ra.answered)
        t = round_times(ra, answered, round_s)
        self.metrics.observe_round(step_s=round_s, compute_s=t.compute_s, data_s=t.data_s, comm_s=t.comm_s,
                                   idle_s=t.idle_s)  # fmt: skip
        record = round_record(ra, t, round_no=self.round, answered=answered, dropped=dropped, accuracy=accuracy,
                              private=self.private)  # fmt: skip
        if self.privacy is not None:
            record["epsilon"] = self.privacy.epsilon()
            record["delta"] = self.privacy.privacy.delta
            self.metrics.epsilon.set(record["epsilon"])
        self.history.append(record)
        if self.checkpoint_dir is not None:  # after the history: a resumed run keeps every round's record
            await asyncio.to_thread(self._save)
            self.metrics.last_ckpt.set(self.round)
        self.metrics.write(record)
        for c in answered:
            self.metrics.client_times(c, ra.client_compute_s.get(c, 0.0), ra.client_comm_s.get(c, 0.0))
        self.metrics.answered.inc(len(answered))
        self.metrics.round_seconds.observe(round_s)
        self.metrics.step.set(self.round)
        self.metrics.round.set(self.round)
        if accuracy is not None:
            self.metrics.accuracy.set(accuracy)
        acc = f", test accuracy {accuracy:.4f}" if accuracy is not None else ""
        who = f"epsilon {record['epsilon']:.4g}" if self.privacy is not None else f"{len(answered)}/{len(ra.sampled)} answered"
        self.log(f"aggregator: round {self.round}/{self.fed.rounds} done in {round_s:.2f} s: {who}{acc}")

    async def wait_clients_told(self, timeout: float) -> None:
        """After the last round: give every client that ever called a chance to hear "done"."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.seen <= self.told_done:
            await asyncio.sleep(0.1)
