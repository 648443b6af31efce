"""A server that remembers: what an honest-but-curious server keeps of a client it watches.

A tracked client trains on the same k private samples every round, and its labels never change.
A server that keeps what it has seen can therefore attack across the rounds (docs/attacker-memory.md):

- ``none``: each round's attack on its own (no memory).
- ``labels``: the client's label counts carried across rounds. Each round's attack starts from the
  remembered labels; when this round's freshly recovered labels differ, the round is attacked with
  both and the labels whose reconstruction explains the update better (lower honest Lsim) are kept.
- ``keep`` (includes ``labels``): the server's estimate of the images is the best candidate it has
  produced so far, by the attacker's own signal: each candidate's honest Lsim on the update it was
  fitted to (measured in step with PSNR, docs/attacker-memory.md), never the ground truth.
- ``joint`` (includes ``keep``): after the round's own attack, one X_hat is fitted to several of the
  client's observed updates at once (``fl_attack.reconstruct`` with a list: each update its own path
  variables), warm-started from the kept estimate, each update weighted by 1/Lsim of its own round's
  best fit so that the informative early updates are not outvoted. It replaces the kept estimate
  only when it explains an update better. Its rounds: ``best:N,latest:M`` (the N best-fitted
  earlier rounds and the M latest, with the current one) or ``all``.

The memory is the server's: ``AttackMemory`` holds ObservedUpdates (no field for private data) and
``Candidate``s, which only ``Candidate.of`` builds, from a Reconstruction (the attacker's output).
It runs on the server side; a worker gets a ``MemoryInputs`` snapshot with its job and returns
candidates (``attack_with_memory``). It is saved in the run folder (``save``/``load``). No Flower
or Ray import here, and none of the evaluator's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from fl_attack.attacker.api import Reconstruction, reconstruct
from fl_attack.attacker.attacks import AttackConfig, parse_methods
from fl_attack.federation.config import ClientOptimizer
from fl_attack.federation.update import ObservedUpdate, TrainingMetadata, save_torch_atomic

MEMORY_MODES = ("none", "labels", "keep", "joint")
MEMORY_SUFFIX = "+memory"  # the method name of the rows of the remembering server's estimate
JOINT_ITERATIONS = 1 / 3  # a warm-started joint attack runs this fraction of the attack's iterations
FORMAT = 1


def check_memory_mode(mode) -> str:
    """``mode`` when it is one of ``MEMORY_MODES``; ValueError otherwise (the one check of it: the run
    config's attack-memory, ``fl-attack replay --memory``, ``AttackMemory``)."""
    if not isinstance(mode, str) or mode not in MEMORY_MODES:
        raise ValueError(f"attack-memory must be one of {', '.join(MEMORY_MODES)}, got {mode!r}")
    return mode


def memory_methods(text: str, mode: str, what: str = "") -> tuple[str, ...]:
    """The methods of a run or replay: "pisme,ig" with mode "keep" -> ("pisme", "ig",
    "pisme+memory", "ig+memory"): each memoryless method and its remembering twin, unless the
    twin is listed already; "pisme+memory" alone runs only the twin. ValueError (prefixed with
    ``what``) for an unknown mode or method, a method listed twice, or "+memory" with mode "none"."""
    prefix = f"{what}: " if what else ""
    try:
        check_memory_mode(mode)
    except ValueError as exc:
        raise ValueError(f"{prefix}{exc}") from None
    names = [m.strip() for m in str(text).split(",") if m.strip()]
    parse_methods(",".join(dict.fromkeys(m.removesuffix(MEMORY_SUFFIX) for m in names)), what)
    twice = next((m for m in names if names.count(m) > 1), None)
    if twice:
        raise ValueError(f"{prefix}method '{twice}' is listed more than once in '{text}'")
    remembering = [m for m in names if m.endswith(MEMORY_SUFFIX)]
    if remembering and mode == "none":
        raise ValueError(f"{prefix}'{remembering[0]}' needs attack-memory = labels, keep or joint (it is 'none')")
    if mode == "none":
        return tuple(names)
    return tuple(names + [m + MEMORY_SUFFIX for m in names if m + MEMORY_SUFFIX not in names and m not in remembering])


def check_memory_labels(methods, labels: str) -> None:
    """ValueError when a remembering method ("METHOD+memory", ``memory_methods``) is among ``methods``
    and ``labels`` is "oracle": the memory keeps only what the attacker produced, never the ground
    truth. The one check of it (the run config's attack-memory with attack-labels, ``fl-attack replay``)."""
    if labels == "oracle" and any(str(m).endswith(MEMORY_SUFFIX) for m in methods):
        raise ValueError(
            "an attack memory keeps only what the attacker produced; "
            "it cannot be used with oracle labels (the ground truth)"
        )


def parse_joint_rounds(text: str) -> tuple[int, int] | None:
    """ "best:2,latest:1" -> (2, 1); "all" -> None (every observed round). ValueError otherwise."""
    text = str(text).strip()
    if text == "all":
        return None
    parts = dict(p.split(":", 1) for p in text.split(",") if ":" in p) if text else {}
    bad = not text or set(parts) - {"best", "latest"} or len(parts) != len(text.split(","))
    try:
        best, latest = int(parts.get("best", 0)), int(parts.get("latest", 0))
    except ValueError:
        bad = True
    if bad or best < 0 or latest < 0 or best + latest < 1:
        raise ValueError(
            f"attack-memory-rounds must be 'all' or 'best:N,latest:M' with N, M >= 0 and N + M >= 1, got '{text}'"
        )
    return best, latest


@dataclass(frozen=True)
class Candidate:
    """One estimate of a client's data the attacker produced from observed updates.

    images: (k,C,H,W) float32 in [0,1]; labels: (k,) int64; fit: honest Lsim in [0, 2] on the update
    it explains best (lower: better; the attacker's own signal); rounds: the rounds of the updates it
    was fitted to; fits: {round: honest Lsim on that round's update}. Built by ``Candidate.of``.
    """

    images: torch.Tensor
    labels: torch.Tensor
    fit: float
    rounds: tuple[int, ...]
    fits: dict

    @classmethod
    def of(cls, rec: Reconstruction, rounds) -> Candidate:
        """The candidate of a reconstruction fitted to the updates of ``rounds`` (in their order)."""
        if not isinstance(rec, Reconstruction):
            raise TypeError(f"a candidate is made from a Reconstruction, got {type(rec).__name__}")
        rounds = tuple(int(r) for r in rounds)
        fits = dict(zip(rounds, rec.lsim_per_update or [rec.lsim_honest]))
        return cls(rec.images.detach().cpu(), rec.labels.detach().cpu(), min(fits.values()), rounds, fits)


@dataclass
class MemoryInputs:
    """What a worker needs from the server's memory for one job (a snapshot; no private data).

    mode: one of MEMORY_MODES; round: the attacked round; labels: (k,) remembered labels or None;
    kept: the kept Candidate or None; earlier: [(round, ObservedUpdate, fit)] the joint attack
    uses besides the current update (empty unless mode is "joint"); fit: NaN when not yet known.
    """

    mode: str
    round: int
    labels: torch.Tensor | None = None
    kept: Candidate | None = None
    earlier: list = field(default_factory=list)


def attack_with_memory(
    update: ObservedUpdate, method: str, inputs: MemoryInputs, **options
) -> tuple[list[Candidate], Reconstruction]:
    """This round's attack(s) for a remembering server: (the candidates it produced, the memoryless
    attack of the round).

    update: the current round's ObservedUpdate; options: ``fl_attack.reconstruct``'s keywords
    (config, device, time_limit, model, label_aux, ...; not ``labels``, ``init`` or ``weights``).
    1. the round's own attack from noise with this round's recovered labels: exactly today's
       memoryless attack (returned too, so it is never run twice); when the remembered labels
       differ from them, a second attack with the remembered ones. Both are candidates; the
       better fit keeps its labels.
    2. mode "joint" with earlier updates: one attack on [earlier..., current] from the best
       candidate so far, a third of the iterations, updates weighted by 1 / their best known fit.
    Raises what ``reconstruct`` raises.
    """
    if inputs.mode not in MEMORY_MODES[1:]:
        raise ValueError(f"attack memory must be one of {', '.join(MEMORY_MODES[1:])}, got {inputs.mode!r}")
    if not isinstance(options.get("config"), AttackConfig):
        raise TypeError("attack_with_memory needs config=AttackConfig(...)")
    memoryless = reconstruct(update, method, labels="recovered", **options)
    candidates = [Candidate.of(memoryless, [inputs.round])]
    if inputs.labels is not None and not torch.equal(inputs.labels.sort().values, memoryless.labels.sort().values):
        candidates.append(Candidate.of(reconstruct(update, method, labels=inputs.labels, **options), [inputs.round]))
    if inputs.mode == "joint" and inputs.earlier:
        best = min([c for c in (inputs.kept, *candidates) if c is not None], key=lambda c: c.fit)
        own = min(c.fit for c in candidates)
        fits = [f for _, _, f in inputs.earlier] + [own]
        known = [f for f in fits if math.isfinite(f)]
        weights = [1 / max(f if math.isfinite(f) else max(known), 1e-6) for f in fits]
        config = options.pop("config")
        joint_config = replace(config, iterations=max(1, math.ceil(config.iterations * JOINT_ITERATIONS)))
        rec = reconstruct(
            [u for _, u, _ in inputs.earlier] + [update],
            method,
            labels=best.labels,
            init=best.images,
            weights=weights,
            config=joint_config,
            **options,
        )
        candidates.append(Candidate.of(rec, [r for r, _, _ in inputs.earlier] + [inputs.round]))
    return candidates, memoryless


@dataclass
class ClientMemory:
    """What the server remembers of one (client, method): its best candidates and the updates seen.

    history: each candidate that was the best of its own and earlier rounds when it came, in that
    order (the best of them is the estimate kept; a resume cuts it back). observed: {round:
    [ObservedUpdate, fit]}, fit being the best honest Lsim any candidate reached on that update (NaN
    until one did)."""

    history: list = field(default_factory=list)
    observed: dict = field(default_factory=dict)

    @property
    def best(self) -> Candidate | None:
        return self.best_until(math.inf)

    def best_until(self, round: float) -> Candidate | None:
        """The best candidate made from updates of rounds <= ``round`` only."""
        known = [c for c in self.history if max(c.rounds) <= round]
        return min(known, key=lambda c: c.fit) if known else None


class AttackMemory:
    """The server's memory of every tracked (client, method), by one mode (MEMORY_MODES).

    key: any hashable public identifier (the strategies use (partition id, method)).
    ``observe`` the update when it arrives, ``inputs`` for its job, ``remember`` the job's
    candidates, ``held`` the estimate the server holds, ``save``/``load`` it in a run folder.
    Raises ValueError for an unknown mode or rounds choice, TypeError for anything but an
    ObservedUpdate or Candidates.
    """

    def __init__(self, mode: str = "none", rounds: str = "best:2,latest:1"):
        check_memory_mode(mode)
        self.mode, self.rounds, self.choice = mode, rounds, parse_joint_rounds(rounds)
        self.clients: dict = {}

    def observe(self, key, round: int, update: ObservedUpdate) -> None:
        """Note ``key``'s update of ``round``; only a joint attack reads it again, so the others keep
        nothing of it (a backlog of jobs would otherwise hold every waiting update in memory.pt)."""
        if not isinstance(update, ObservedUpdate):
            raise TypeError(f"the memory keeps ObservedUpdates only, got {type(update).__name__}")
        memory = self.clients.setdefault(key, ClientMemory())
        if self.mode == "joint":
            memory.observed[int(round)] = [update, math.nan]

    def inputs(self, key, round: int) -> MemoryInputs:
        """The snapshot for the job attacking ``key``'s update of ``round`` (observed first): what the
        server held from the rounds before it, even when a later round's candidates are already in
        (``fl-attack replay --missing`` completes a round's job after the resumed run's later ones)."""
        memory = self.clients.setdefault(key, ClientMemory())
        best = memory.best_until(round - 1)
        earlier = []
        if self.mode == "joint":
            earlier = [(r, u, f) for r, (u, f) in sorted(memory.observed.items()) if r in self._chosen(memory, round)]
        return MemoryInputs(
            self.mode,
            int(round),
            labels=best.labels.clone() if best is not None else None,
            kept=best if self.mode in ("keep", "joint") else None,
            earlier=earlier,
        )

    def _chosen(self, memory: ClientMemory, round: int) -> set[int]:
        """The earlier rounds a joint attack of ``round`` uses: the best-fitted and the latest."""
        rounds = [r for r in memory.observed if r < round]
        if self.choice is None:
            return set(rounds)
        best, latest = self.choice
        fitted = sorted((f, r) for r in rounds if math.isfinite(f := memory.observed[r][1]))
        return {r for _, r in fitted[:best]} | set(sorted(rounds)[len(rounds) - latest :] if latest else [])

    def remember(self, key, candidates: list[Candidate]) -> Candidate | None:
        """Merge a job's candidates; returns the estimate held once their round is in (``held``).
        A candidate is kept when it beats the best of its own and earlier rounds, so a round's job
        completed late (``replay --missing``) is merged as it would have been in its turn."""
        memory = self.clients.setdefault(key, ClientMemory())
        for c in candidates:
            if not isinstance(c, Candidate):
                raise TypeError(f"the memory keeps the attacker's Candidates only, got {type(c).__name__}")
            for r, f in c.fits.items():
                if r in memory.observed and not memory.observed[r][1] <= f:
                    memory.observed[r][1] = f
            prior = memory.best_until(max(c.rounds))
            if prior is None or c.fit < prior.fit:
                memory.history.append(c)
        self._prune(memory)
        return self.held(key, candidates, until=max((max(c.rounds) for c in candidates), default=math.inf))

    def held(self, key, latest: list[Candidate] | None = None, until: float = math.inf) -> Candidate | None:
        """The estimate the server holds once round ``until`` is in (default: now): under "labels"
        the latest round's own best candidate (its images are not kept), else the best candidate
        made from rounds <= ``until``."""
        memory = self.clients.get(key)
        best = None if memory is None else memory.best_until(until)
        if best is not None and self.mode == "labels" and latest:
            return min(latest, key=lambda c: c.fit)
        return best

    def _prune(self, memory: ClientMemory) -> None:
        """Drop the updates no later joint attack can choose (all are kept under "all")."""
        if self.mode != "joint":
            memory.observed.clear()
        elif self.choice is not None:  # what the next round and the rounds still waiting may choose
            waiting = {r for r, (_, fit) in memory.observed.items() if math.isnan(fit)}
            keep = set(waiting)
            for r in waiting | {max(memory.observed, default=0) + 1}:
                keep |= self._chosen(memory, r)
            memory.observed = {r: v for r, v in memory.observed.items() if r in keep}

    def cut_back(self, done: int) -> None:
        """Forget everything of rounds after ``done`` (a resume runs them again)."""
        for memory in self.clients.values():
            memory.history = [c for c in memory.history if max(c.rounds) <= done]
            memory.observed = {r: v for r, v in memory.observed.items() if r <= done}

    def state_dict(self) -> dict:
        return {"format": FORMAT, "mode": self.mode, "rounds": self.rounds, "clients": self.clients}

    def save(self, path) -> None:
        """Atomically to ``path`` (torch.save)."""
        save_torch_atomic(path, self.state_dict())

    @classmethod
    def load(cls, path) -> AttackMemory:
        """A memory saved by ``save``. ValueError (one line) when ``path`` is missing, cut off or not
        an attack memory of this format. Read with torch's weights-only unpickler, which builds only
        tensors, containers and the memory's own dataclasses (``_SAVED_TYPES``): a file that names
        anything else is refused, so a foreign memory.pt cannot run code."""
        try:
            with torch.serialization.safe_globals(_SAVED_TYPES):
                state = torch.load(path, weights_only=True)
        except FileNotFoundError:
            raise ValueError(f"{path} is missing") from None
        except Exception as exc:  # cut off, or another file
            raise ValueError(f"{path} is not an attack memory fl-attack wrote ({type(exc).__name__})") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"{path} is not an attack memory of format {FORMAT}")
        memory = cls(state["mode"], state["rounds"])
        memory.clients = state["clients"]
        return memory


# What a saved memory pickles besides tensors and containers (joint mode keeps ObservedUpdates).
_SAVED_TYPES = [Candidate, ClientMemory, ObservedUpdate, TrainingMetadata, ClientOptimizer]
