"""The Redis key schema: every key strata_redis uses is built here and nowhere else.

All keys of one job share the Redis Cluster hash tag ``{<job_id>}``, so every script's keys
live in one slot and the library runs unchanged on Redis Cluster. Names are words, so
``redis-cli --scan --pattern 'strata:*'`` reads as the job's state (docs/reference/keys.md).

A variable part that is not the job id (a barrier or dataset name) always comes last in its
key, so ``:`` or braces inside it cannot collide with another key of the schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from .status import ANCHORS
from .validate import check_id

PREFIX = "strata"

#: the version of this schema and of the value formats its owners write (a job's layout).
#: Bump it with any change that code of another version would misread (the epoch pool
#: became a bitmap: older code's epoch would read as every shard free). A job records the
#: layout it was made with in its era (``era.py``), and code of another layout refuses it.
LAYOUT = 1


#: the ``SCAN`` ``MATCH`` pattern of every key of every job (``job_of`` reads the job back)
JOBS_KEYS_PATTERN = f"{PREFIX}:{{*}}:*"
_GLOB = frozenset("*?[]\\")


def glob_escape(text: str) -> str:
    """``text`` with the glob characters of a ``MATCH`` pattern (``* ? [ ] \\``) escaped."""
    return "".join("\\" + c if c in _GLOB else c for c in text)


def job_of(key: str) -> str | None:
    """The job id of a key of the schema (``strata:{<job>}:...``), None for another key.

    A job id holds no brace, so the tag ends at the first ``}`` (a barrier or dataset name
    later in the key may hold braces of its own)."""
    head = f"{PREFIX}:{{"
    if not key.startswith(head):
        return None
    end = key.find("}", len(head))
    if end <= len(head) or not key.startswith(":", end + 1):
        return None
    return key[len(head) : end]


@dataclass(frozen=True)
class Keys:
    """The keys of one job."""

    job_id: str

    def __post_init__(self) -> None:
        check_id("job_id", self.job_id, job=True)

    @property
    def base(self) -> str:
        """``strata:{<job>}``: the prefix of every key of this job."""
        return f"{PREFIX}:{{{self.job_id}}}"

    @property
    def pattern(self) -> str:
        """The ``SCAN``/``KEYS`` ``MATCH`` pattern of every key of this job (and no other's):
        ``strata:{<job>}:*`` with the glob characters of the job id escaped."""
        return f"{PREFIX}:{{{glob_escape(self.job_id)}}}:*"

    # -- the job's lifecycle -----------------------------------------------------------------
    @property
    def job(self) -> str:
        """HASH the job's record, read and written only by ``coordination/lifecycle.py`` and
        its scripts: ``created_ms`` (the first registration), ``state`` (``running`` or
        ``ended``), ``ended_ms``, ``expires_ms`` (while ended: when its keys expire),
        ``retention_s`` (how long an ended job's keys are kept), ``heartbeat_timeout_ms``
        (the job's: readers judge staleness by it), ``reopened`` (times an ended job was
        joined again), ``reopened_from`` (the expiry the last reopening cleared)."""
        return f"{self.base}:job"

    # -- worker registry ---------------------------------------------------------------
    @property
    def heartbeats(self) -> str:
        """ZSET worker id -> last heartbeat, ms on Redis' clock; live workers only."""
        return f"{self.base}:heartbeats"

    @property
    def status(self) -> str:
        """HASH worker id -> idle | training | checkpointing | failed | left."""
        return f"{self.base}:status"

    @property
    def incarnation(self) -> str:
        """HASH worker id -> membership generation of its latest registration."""
        return f"{self.base}:incarnation"

    @property
    def info(self) -> str:
        """HASH worker id -> JSON {host, address, gpu_count, labels, pid, started, space}
        (the registering process: its pid, start time in clock ticks since boot and pid
        space, ``<boot id>/<pid namespace>``, or null where unknown; entries written before
        they were recorded lack them)."""
        return f"{self.base}:info"

    @property
    def generation(self) -> str:
        """STRING membership generation: +1 on every join, leave and failure."""
        return f"{self.base}:generation"

    @property
    def era(self) -> str:
        """STRING the job's era: a random id and the layout the job's state is written in
        (``<16 hex>.v<LAYOUT>``), set once (SET NX) by the job's first script call; every
        script checks it first (``era.py``). Gone or changed: the state was lost;
        ``<era>!rolled-back:<clock><<seen>``: the state went back (``clock``)."""
        return f"{self.base}:era"

    @property
    def clock(self) -> str:
        """STRING the job's clock, ``tick * 16 + made``: the tick +1 per script call (the era
        check in front of every script), never going back — a process remembers the highest
        tick it saw (checkpoints record it), and Redis holding less means its state went back;
        ``made``'s bits: the anchors made so far (bit 0 fence, 1 generation, 2 epoch, 3
        datasets: ``status.ANCHORS``), which every script checks still exist."""
        return f"{self.base}:clock"

    @property
    def history(self) -> str:
        """STRING the job's recent history: at ``(tick % status.HISTORY_TICKS) * 8``, the id
        (8 random characters) of the script call that took that tick. A process sends the id of
        the call that took its mark; another id there means Redis' state is not the one it
        saw, even where later calls raised the clock back (``era.py``). 32 KiB per job."""
        return f"{self.base}:history"

    @property
    def anchors(self) -> tuple[str, ...]:
        """The job's anchor keys (``status.ANCHORS``: fence, generation, epoch, datasets):
        once made, they exist for as long as the era stands; every script checks those made."""
        return tuple(getattr(self, name) for name in ANCHORS)

    def doctor_probe(self, what: str) -> str:
        """``strata doctor``'s probe of one right (``what``: string, hash, script, transaction,
        list): written and deleted (or expired) at once; nothing else reads it."""
        return f"{self.base}:doctor:{what}"

    @property
    def events(self) -> str:
        """STREAM membership events (join/leave/fail), capped; waiters block on it."""
        return f"{self.base}:events"

    @property
    def reaper(self) -> str:
        """HASH the reaper's view of Redis stalls and write outages: ``last`` stamped step,
        ``quiet``, ``grace``, ``failed`` (the last step that declared a failure; ms)."""
        return f"{self.base}:reaper"

    @property
    def failures(self) -> str:
        """STRING workers declared failed over the job's life: +1 per failure, written only
        by ``reap_workers.lua`` (``coordination/registry.py``); never reset, so a failed
        worker that rejoins stays counted (``strata_worker_failures_total``)."""
        return f"{self.base}:failures"

    # -- barriers and epochs -------------------------------------------------------------
    def barrier(self, name: str) -> str:
        """HASH a barrier's state: gen, expected, first_us, ev, r:<gen> recent outcomes."""
        return f"{self.base}:barrier:{name}"

    def barrier_arrived(self, name: str) -> str:
        """SET the workers that arrived in a barrier's current generation."""
        return f"{self.base}:barrier_arrived:{name}"

    def barrier_tickets(self, name: str) -> str:
        """HASH worker id -> "<generation> <ticket>": its latest arrival, for retries."""
        return f"{self.base}:barrier_tickets:{name}"

    def barrier_release(self, name: str, generation: int) -> str:
        """LIST one release token per arrival of a generation; its waiters BLPOP it."""
        return f"{self.base}:barrier_release:{generation}:{name}"

    def waiters_doorbell(self, process: str) -> str:
        """LIST one process's doorbell: a waiter RPUSHes it so the process's shared blocking
        pop (``coordination/waiters.py``) takes a new release list in; expires."""
        return f"{self.base}:doorbell:{process}"

    def barrier_wake(self, name: str) -> str:
        """STREAM a barrier's outcomes (released/broken), capped; its watchers XREAD it."""
        return f"{self.base}:barrier_wake:{name}"

    @property
    def epoch(self) -> str:
        """STRING the job's epoch: +1 per release of the epoch barrier, set back by a resume
        (``restore_epoch.lua``; both ``coordination/epochs.py``'s); never expires."""
        return f"{self.base}:epoch"

    @property
    def epoch_restored(self) -> str:
        """STRING the round that last put the job's epoch back from a checkpoint
        (``coordination/epochs.py``: ``restore_epoch.lua`` sets the epoch once per round)."""
        return f"{self.base}:epoch_restored"

    @property
    def barrier_latency(self) -> str:
        """STREAM one entry per barrier release (its latency), capped, for the dashboard."""
        return f"{self.base}:barrier_latency"

    # -- elastic rendezvous -----------------------------------------------------------------
    @property
    def rendezvous(self) -> str:
        """HASH the rendezvous, read and written only by ``coordination/rendezvous.py`` and its
        scripts: ``round``, ``state`` (joining/closed: the round took its members),
        ``opened_ms``, ``deadline_ms``, ``closed_ms``, ``world_size``, ``fresh``,
        ``synced`` (the last round whose members all hold the job's state: a fresh one, or
        one past an epoch barrier; its members carry it into the next round),
        ``generation``, ``restarts_failure``/``restarts_growth``, the round's fate
        (``broken_round``, ``broken``, ``reason``), the epoch review (``decided_epoch``,
        ``decision``), the membership-event cursor (``mev``, ``mgen``, ``mscan``), the
        expected-set fill (``escan``), and ``ended`` (the rendezvous is over for good:
        torchrun's ``set_closed``/``shutdown``: no round forms any more)."""
        return f"{self.base}:rendezvous"

    @property
    def restores(self) -> str:
        """HASH "restored:<dataset>" -> the round that put the dataset's data position back
        from a checkpoint (``data/position.py``); "restored:<dataset>:next" -> the next chunk
        while that restore is under way."""
        return f"{self.base}:restores"

    def round_members(self, round_: int) -> str:
        """ZSET a round's members -> order score: rank order. A member carrying the job's
        state scores its previous rank; another member of the previous round, an offset plus
        its previous rank; a new one, a larger offset plus its arrival ms."""
        return f"{self.base}:round_members:{round_}"

    def round_ranks(self, round_: int) -> str:
        """HASH a round's members -> incarnation (a member's rank: its place in
        ``round_members``)."""
        return f"{self.base}:round_ranks:{round_}"

    def round_expected(self, round_: int) -> str:
        """SET while a round joins: the live workers it still waits for (the previous round's
        members, the waiting workers) before it may close early."""
        return f"{self.base}:round_expected:{round_}"

    @property
    def rendezvous_waiting(self) -> str:
        """ZSET workers that arrived while a round was running -> ms of their last look
        (Redis' clock), refreshed while they wait: they join the next one. An entry older
        than the heartbeat timeout is a dead waiter's: not counted, dropped later."""
        return f"{self.base}:rendezvous_waiting"

    @property
    def rendezvous_events(self) -> str:
        """STREAM rendezvous events (open, close, broken, end), capped; joiners XREAD it."""
        return f"{self.base}:rendezvous_events"

    def round_checkpoints(self, round_: int) -> str:
        """ZSET the checkpoints opened in a round: index member (as in ``checkpoints``) -> the
        job's epoch it was opened in, so ranks whose epoch ended early fill them in at the
        epoch barrier, and a rank joining mid-epoch takes the round's step from them
        (``checkpoint/rounds.py``); trimmed as epochs pass, expires a day after its last
        write."""
        return f"{self.base}:round_checkpoints:{round_}"

    def preempt_stop(self, round_: int) -> str:
        """STRING the step at which a round's members stop and save on preemption (the
        first signalled member's proposal, ``preemption.py``); kept a day."""
        return f"{self.base}:preempt_stop:{round_}"

    def torch_store(self, round_: int) -> str:
        """HASH a round's ``torch.distributed`` store (``strata_redis.torch.RedisStore``):
        key -> value; kept a day after its last write."""
        return f"{self.base}:torch_store:{round_}"

    # -- datasets and shard leases -------------------------------------------------------
    @property
    def datasets(self) -> str:
        """HASH dataset name -> JSON params {total_samples, samples_per_shard, shuffle, seed},
        and the field "" (1) once a dataset was registered: an anchor (``status.ANCHORS``),
        it stands while the era does, even with every dataset deleted."""
        return f"{self.base}:datasets"

    @property
    def fence(self) -> str:
        """STRING fencing-token counter: +1 per lease grant, never expires, never goes back."""
        return f"{self.base}:fence"

    def epochs_kept_whole(self, dataset: str) -> str:
        """STRING how many finished epochs of a dataset before the newest keep their
        per-shard record (``record.keep_whole``; missing: 0, an epoch is closed into its
        summary when the next epoch's pool is built)."""
        return f"{self.base}:epochs_kept_whole:{dataset}"

    def lease_totals(self, dataset: str) -> str:
        """HASH a dataset's lease counts over the job's life, never reset at a new epoch
        (written only by ``acquire_shard.lua`` and ``release_shard.lua``, read through
        ``data/record.py``): ``steals`` (grants from the shared pool, as the epoch meta's
        ``steals``), ``samples`` (samples trained: a completion counts its shard's samples
        from its lease's start, a hand-back with an offset the part taken), ``w:<worker>``
        (those samples by worker: one field per worker that trained any, bounded by the
        job's workers). Expires with the job (``coordination/lifecycle.py``)."""
        return f"{self.base}:lease_totals:{dataset}"

    def lease_keys(self, dataset: str, epoch: int) -> LeaseKeys:
        """The keys of one dataset epoch's shard leases."""
        return LeaseKeys(self, dataset, epoch)

    # -- checkpoints -----------------------------------------------------------------------
    # A checkpoint is the loop's (epoch, step) and the job's run (``checkpoint/ids.py``). Its
    # index member is "<run>:<epoch>:<step>", each zero-padded to 16 digits, the epoch "-"
    # when it has none (run 1, epoch 3, step 200: 0000000000000001:0000000000000003:
    # 0000000000000200); its label ("step_5000", "epoch_2_step_5000", "run_1_epoch_2_step_0")
    # names its directory in storage and ends its own keys below.
    @property
    def checkpoints(self) -> str:
        """ZSET the committed checkpoints: index member -> 0. Every score is 0, so Redis sorts
        the members by their bytes: (run, epoch, step) order, newest last
        (``ZRANGE key 0 0 REV`` is the newest)."""
        return f"{self.base}:checkpoints"

    @property
    def checkpoint_info(self) -> str:
        """HASH index member -> the committed checkpoint's metadata.json (JSON: run, epoch,
        step, world_size, acked_ms, workers, files with sizes and checksums)."""
        return f"{self.base}:checkpoint_info"

    @property
    def checkpoint_locations(self) -> str:
        """HASH index member -> where the committed checkpoint lives (``s3://bucket/prefix/
        <job>/checkpoints/<label>``, ``file:///...``): written with the commit
        (``commit_checkpoint.lua``) or a rebuild of the index, dropped with the entry
        (``checkpoint/index.py``); missing for checkpoints committed before it was kept."""
        return f"{self.base}:checkpoint_locations"

    @property
    def checkpoint_indexed(self) -> str:
        """STRING ms when the index was rebuilt from storage; missing: rebuild it."""
        return f"{self.base}:checkpoint_indexed"

    @property
    def checkpoint_records(self) -> str:
        """STREAM one entry per save, capped: step, epoch ("" if none), run, rank, worker,
        bytes, seconds, mb_s, outcome (uploaded/aborted), at_ms."""
        return f"{self.base}:checkpoint_records"

    @property
    def checkpoint_totals(self) -> str:
        """HASH the job's checkpoint totals over its life, never reset (``checkpoint/
        records.py``): ``saves`` and ``saved_bytes``, ``save_ms`` (each rank's acked
        save, by ``ack_checkpoint.lua``), ``aborted_steps`` (checkpoints that became aborted,
        by ``abort_checkpoint.lua`` or a superseded ack), ``aborted_saves`` (failed saves
        recorded by ``abort_checkpoint.lua``)."""
        return f"{self.base}:checkpoint_totals"

    @property
    def checkpoint_run(self) -> str:
        """HASH the job's run (``checkpoint/rounds.py``): ``run`` (0 for the job's first
        launch; a whole-job relaunch makes it the newest committed checkpoint's run + 1, and
        never less than the previous run + 1), ``round`` (the fresh rendezvous round that
        started it: every member of that round reads the same run), ``started_ms``."""
        return f"{self.base}:checkpoint_run"

    def checkpoint_step(self, label: str) -> str:
        """HASH a checkpoint being saved, by label: state (open/committing/committed/aborted),
        world_size, run, epoch, step, opened_ms, leader, acked_ms, acked_clock (the job's
        clock at the last ack), committed_ms, culprit,
        reason, aborted_ms, r:<rank> -> worker."""
        return f"{self.base}:checkpoint_step:{label}"

    def checkpoint_acks(self, label: str) -> str:
        """HASH rank -> JSON {worker, files} of the ranks that uploaded and acked a checkpoint."""
        return f"{self.base}:checkpoint_acks:{label}"

    def checkpoint_wake(self, label: str) -> str:
        """LIST tokens pushed when a checkpoint commits or aborts; its waiters BLPOP it."""
        return f"{self.base}:checkpoint_wake:{label}"


@dataclass(frozen=True)
class LeaseKeys:
    """The keys of one (dataset, epoch): ``strata:{J}:<what>:<epoch>:<dataset>``.

    The epoch (digits) comes before the dataset name, which comes last.
    """

    keys: Keys
    dataset: str
    epoch: int

    def _key(self, what: str) -> str:
        return f"{self.keys.base}:{what}:{self.epoch}:{self.dataset}"

    @property
    def meta(self) -> str:
        """HASH num_shards, created_ms, swept generation (sweep_gen, sweep_cursor: a sweep of
        the holders under way, in steps), steals (this epoch's; ``Keys.lease_totals`` keeps the
        job's), cursor (where the next steal looks for a
        free shard), done (shards done), by:<worker> (shards it completed),
        last:<worker> ("<shard> <token> <grant>": its last completion); what was made, which
        ``acquire_shard.lua`` checks still exists: offsets (the offsets HASH was written),
        indexed (the workers HASH was), restored (the restored HASH was), seg:<k> (record
        segment k was). Once the epoch is closed
        (``init_epoch.lua``: finished, or the job is past it, when a later epoch's pool is
        built) it is the epoch's summary, of constant size in the shards (bounded by the
        workers): its other keys are gone, it gains ``closed_ms``, loses the pool fields, and
        expires ``RECORD_TTL_S`` later."""
        return self._key("epoch_meta")

    @property
    def workers(self) -> str:
        """HASH the epoch's completers, indexed for its record: n (how many), w:<worker> ->
        its index (1..), i:<index> -> the worker."""
        return self._key("epoch_workers")

    @property
    def taken(self) -> str:
        """STRING bitmap, bit = shard id: 1 leased or done, 0 in the pool (``BITPOS`` finds a
        free shard; missing bits are 0). 1 bit per shard, created at its size by
        ``init_epoch``."""
        return self._key("shards_taken")

    @property
    def holders(self) -> str:
        """HASH shard id -> "<token> <expires_ms> <grant id> <worker id>" for leased shards
        (bounded by the leases held). The grant id (16 hex digits, random, sent by the call
        that leased it) is what a completion, renewal or release must name besides the token:
        a token number issued again after a rollback is not the same grant."""
        return self._key("shard_leases")

    @property
    def expiry(self) -> str:
        """ZSET shard id -> lease expiry, ms on Redis' clock."""
        return self._key("lease_expiry")

    @property
    def done(self) -> str:
        """STRING bitmap, bit = shard id: 1 done (completed, or restored done). 1 bit per
        shard, created at its size by ``init_epoch``."""
        return self._key("shards_done_bits")

    def record(self, segment: int) -> str:
        """STRING the exactly-once completion record of shards ``[segment * 65535, (segment
        + 1) * 65535)`` (``record.RECORD_SEGMENT``), a ``BITFIELD`` of 96 bits per shard: the
        fencing token of the completion (i64, bit ``96 * (shard % 65535)``), then the
        completer's index in ``workers`` (u32; 0 with token 0: restored from a
        checkpoint, or not done). 12 bytes per shard, created whole (zeros, 768 KiB) by the
        segment's first completion."""
        return self._key(f"shards_record_{segment}")

    @property
    def offsets(self) -> str:
        """HASH shard id -> samples already trained, for shards restored part-way from a
        checkpoint (the next lease of the shard starts there)."""
        return self._key("shard_offsets")

    @property
    def restored(self) -> str:
        """HASH shard id -> samples already trained, for the shards a checkpoint restore put
        back part-way: the restore's offsets as it wrote them, never changed after (the
        offsets HASH moves with hand-backs). Every member's data position carries them until
        those shards are done (``data/stream.py``), whether it resumed or joined later."""
        return self._key("shard_restored")

    @property
    def lockstep(self) -> str:
        """HASH "<round>" (or "<round>:pad", padding instead of dropping) -> the batches each
        member of that round gets in this epoch's lockstep walk (``data/walks/lockstep.py``)."""
        return self._key("lockstep_quota")
