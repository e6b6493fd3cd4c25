"""The one release runner shared by TopDown, group sizes and synth: output and private folder,
the run lock, the secret policy, resume checks, one clock, and the manifest's common fields.

Secret policy (the same for every release)
-------------------------------------------
Noise is a deterministic function of the run secret and the stream keys, so two releases made
with one secret on different data would differ exactly by the change in the data. Hence:

* a fresh run without a user secret generates a new one in its private folder (mode 0600);
  only ``--resume`` reuses it;
* a user-supplied secret (``--secret-file``, ``[run] secret_file`` or ``[run] secret_env``) is
  *bound* to the first release made with it: the binding registry records, under the secret's
  fingerprint and the family of noise streams the release draws from (the release kind, and
  PGSR's noise kind or synth's method, which are parts of every stream key), a fingerprint of
  what was measured (the input's content and
  every config setting that reaches the noise). A later fresh run of the same kind with the same
  secret on another input or measurement config is refused in one line. Rerunning the identical
  measurement (the same data, the same noise) reveals nothing new and is allowed, as is a
  different post-processing of the same measurements (``[estimation] method``, PGSR ``dp``,
  ``relaxed`` and ``relaxed_families``). ``--reuse-secret`` lifts the rule for experiments;
  their manifest says ``"for_release": false``.
* Families of streams are disjoint, so one secret may serve one TopDown and one group-size
  release of a run date.
* ``--secret-file`` names the secret explicitly: if the config's ``[run] secret_env`` variable
  is set too, both must hold the same secret, else the run is refused in one line
  (:class:`SecretSource`), so a variable left in a shell never silently wins over the file the
  command names.

The registry is ``$CENSUSDP_SECRET_REGISTRY`` (default ``~/.censusdp/secret_bindings``, mode
0700); it holds fingerprints only, never a secret. On a cluster in deploy-mode ``cluster``, point
it at storage every driver host shares.

Evaluation against the truth (``--evaluate``) is internal: it goes to its own folder beside the
release (``<output>.evaluation/`` or ``--evaluation-output``), never inside it, and the manifest,
which travels with the release, does not list it. The folder carries a marker naming the release
it evaluates; only a folder with that marker is ever replaced.

What a release is made of is one list, :class:`ReleaseContents`: its input, its measurement, its
estimation and its outputs (the tables its folder holds), each part fingerprinted key by key.
The secret binding reads the first two only; the run state (``state.json`` in the private
folder) records every part and the secret's fingerprint, and ``--resume`` continues only the
same release, naming every key that changed; the manifest lists the same tables, and a release
folder holds no Delta table its manifest does not list.

Every check that can refuse a run (the output, the evaluation folder, the lock, the run state)
runs before a secret is read or made, and a refused run leaves nothing behind. An output must be
a folder of its own: not a symbolic link (``--overwrite`` would replace what it points to), not
an input, not inside one and not holding one. A run holds an exclusive lock on its private
folder from start to end, taken before anything is written.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import hmac
import json
import logging
import os
import shutil
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

from censusdp_spark.model.config import RunOptions
from censusdp_spark.privacy import load_or_create_secret, secret_fingerprint
from censusdp_spark.privacy.streams import SECRET_FILE_NAME
from censusdp_spark.release.manifest import versions, write_manifest

log = logging.getLogger("censusdp")

REGISTRY_ENV = "CENSUSDP_SECRET_REGISTRY"
RELEASE_MARKER = ".censusdp-release"
"""Written into an output folder when a run prepares it: ``--overwrite`` replaces only a folder
holding this marker or a manifest."""
EVALUATION_MARKER = ".censusdp-evaluation"
"""Written into an evaluation folder (JSON: the release it evaluates); only a folder holding it
is ever replaced."""
_HASH_CONTENT_LIMIT = 4 * 2**30
"""Inputs up to this many bytes are fingerprinted by content; larger ones by (path, size,
modification time) of every file, which a rewrite at the same path still changes."""


class OutputExistsError(RuntimeError):
    """The output folder holds a previous release and ``--overwrite`` was not given."""


class ResumeError(RuntimeError):
    """``--resume`` was asked for a run that cannot be resumed (no state, or another run)."""


class SecretError(RuntimeError):
    """The run secret cannot be used: unreadable, readable by others, or already bound."""


class SecretReuseError(SecretError):
    """A user secret already bound to another release was given to a fresh run."""


class RunLockedError(RuntimeError):
    """Another run holds the lock on this run's private folder."""


PARTS = ("input", "measurement", "estimation", "outputs")
"""The parts of a release, in the order a run makes them."""
MEASURED_PARTS = ("input", "measurement")
"""The parts that reach the noise: all the secret binding reads."""


@dataclass(frozen=True)
class ReleaseContents:
    """What a release is made of, part by part (``PARTS``), each a map from a key (a config key
    such as ``estimation.method``, or a command-line setting) to its value:

    * ``input``: the content of the files measured (not their path);
    * ``measurement``: every config table and setting that reaches the noise;
    * ``estimation``: how the noisy measurements become the release (post-processing);
    * ``outputs``: what is computed from the estimates, and ``tables``, the Delta tables the
      release folder holds.

    ``measurement_sha256`` is what the secret binding records: the measured parts alone, so a
    secret may post-process the same measurements again. A resumed run must match every part."""

    release: str
    parts: Mapping[str, Mapping[str, Any]]
    measurement_sha256: str

    @property
    def tables(self) -> list[str]:
        return list(self.parts["outputs"]["tables"])

    def fingerprints(self) -> dict[str, dict[str, str]]:
        """Per part, the SHA-256 of each key's value (what the run state records)."""
        return {part: {k: _sha256(v) for k, v in keys.items()} for part, keys in self.parts.items()}

    def changed(self, recorded: Mapping[str, Mapping[str, str]]) -> list[tuple[str, str]]:
        """``(part, key)`` of every key whose value is not the one ``recorded`` fingerprints."""
        now = self.fingerprints()
        return [
            (part, key)
            for part in PARTS
            for key in sorted({*now.get(part, {}), *recorded.get(part, {})})
            if now.get(part, {}).get(key) != recorded.get(part, {}).get(key)
        ]


def release_contents(
    release: str,
    config: Mapping[str, Any] | str,
    input_sha256: str,
    *,
    tables: Sequence[str],
    estimation_keys: Iterable[tuple[str, ...]] = (),
    output_keys: Iterable[tuple[str, ...]] = (),
    settings: Mapping[str, Any] | None = None,
    estimation: Mapping[str, Any] | None = None,
) -> ReleaseContents:
    """The contents of a release of kind ``release``. ``config`` is the TOML document (as the
    loaders keep it, so a config given as a mapping fingerprints as the file it mirrors) or its
    text; without ``[run]`` and the input's path, its ``estimation_keys`` make the estimation
    part, its ``output_keys`` the outputs part with ``tables``, and the rest the measurement
    part with the measurement ``settings`` (command-line choices that change what is measured).
    ``estimation`` adds post-processing settings (files read only to estimate, command-line
    choices). A table left empty by taking out the keys counts as absent (adding
    ``[output.pl94_tables]`` to a config keeps its measurement)."""
    doc = tomllib.loads(config) if isinstance(config, str) else copy.deepcopy(dict(config))
    doc.pop("run", None)
    if isinstance(doc.get("input"), dict):
        doc["input"].pop("path", None)
    chosen = {".".join(key): _take(doc, key) for key in estimation_keys}
    outputs = {".".join(key): _take(doc, key) for key in output_keys}
    measured = dict(settings or {})
    canonical = {"release": release, "input": input_sha256, "config": doc, "settings": measured}
    return ReleaseContents(
        release,
        {
            "input": {"input": input_sha256},
            "measurement": {**doc, **measured},
            "estimation": {**chosen, **(estimation or {})},
            "outputs": {**outputs, "tables": list(tables)},
        },
        _sha256(canonical),
    )


def _take(doc: dict[str, Any], key: tuple[str, ...]) -> Any:
    """Remove ``key`` from ``doc`` and return its value (None if absent); a table it leaves
    empty is removed too, as if the config had never had it."""
    path: list[Any] = [doc]  # the tables from the document down to the key's
    for part in key[:-1]:
        path.append(path[-1].get(part, {}) if isinstance(path[-1], dict) else {})
    value = path[-1].pop(key[-1], None) if isinstance(path[-1], dict) else None
    for parent, part, table in reversed(list(zip(path, key, path[1:], strict=False))):
        if table == {}:
            parent.pop(part, None)
    return value


def _sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(kw_only=True)
class RunState:
    """What a resumed run must match and which steps are committed (no confidential value):
    ``parts``, the fingerprints of every key of the release's contents."""

    release: str
    output: str
    parts: dict[str, dict[str, str]]
    secret_fingerprint: str
    measured: bool = False
    steps_done: list[str] = field(default_factory=list)

    @staticmethod
    def path(private_dir: Path) -> Path:
        return private_dir / "state.json"

    def save(self, private_dir: Path) -> None:
        """Replace the state file atomically."""
        target = self.path(private_dir)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, target)

    @classmethod
    def load(cls, private_dir: Path) -> RunState | None:
        target = cls.path(private_dir)
        if not target.exists():
            return None
        try:
            state = cls(**json.loads(target.read_text()))
        except (ValueError, TypeError) as err:
            raise ResumeError(
                f"{target}: unreadable run state ({err}); start a fresh run"
            ) from None
        text = (state.release, state.output, state.secret_fingerprint)
        if (
            not all(isinstance(v, str) for v in text)
            or not isinstance(state.parts, dict)
            or not all(
                isinstance(keys, dict) and all(isinstance(v, str) for v in keys.values())
                for keys in state.parts.values()
            )
            or not isinstance(state.measured, bool)
            or not isinstance(state.steps_done, list)
            or not all(isinstance(v, str) for v in state.steps_done)
        ):
            raise ResumeError(
                f"{target}: unreadable run state (a field of the wrong type); start a fresh run"
            )
        return state


NO_SECRET = "none: post-processing of given noisy measurements"
"""The secret fingerprint of a run that draws no noise (``ReleaseRun`` without a secret)."""


def input_fingerprint(paths: Sequence[Path]) -> str:
    """SHA-256 over every file under ``paths`` (sorted): content, or metadata past the limit."""
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
    by_content = sum(f.stat().st_size for f in files) <= _HASH_CONTENT_LIMIT
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f}\0{f.stat().st_size}\0".encode())
        if by_content:
            with open(f, "rb") as handle:
                for chunk in iter(lambda: handle.read(2**20), b""):
                    digest.update(chunk)
        else:
            digest.update(str(f.stat().st_mtime_ns).encode())
    return digest.hexdigest()


def private_dir_for(output: Path) -> Path:
    """The private folder of a run writing to ``output``: beside it, never inside it."""
    return output.parent / f"{output.name}.private"


def with_command_line(run: RunOptions, output: Path | None, secret_file: Path | None) -> RunOptions:
    """``[run]`` with ``--output`` and ``--secret-file`` applied. A different output is a
    different run: its private folder (state, generated secret) sits beside it rather than in
    the config's ``private_dir``."""
    if output is not None:
        run = replace(run, output=output, private_dir=private_dir_for(output))
    if secret_file is not None:
        run = replace(run, secret_file=secret_file)
    return run


class ReleaseFlags(Protocol):
    """The command-line choices every release's runner reads (``release.flags.add_release_flags``)."""

    @property
    def overwrite(self) -> bool: ...

    @property
    def reuse_secret(self) -> bool: ...

    @property
    def evaluate(self) -> bool: ...

    @property
    def evaluation_output(self) -> Path | None: ...

    @property
    def secret_file(self) -> Path | None: ...  # --secret-file: named, so no variable replaces it


@dataclass(frozen=True, kw_only=True)
class ReleaseChoices:
    """The ``ReleaseFlags`` and ``--output`` as a release's options hold them: what every
    release's command (``release.flags.add_release_flags``) and ``run_*`` call choose beside
    the config. A release's options extend it with their own."""

    output: Path | None = None
    secret_file: Path | None = None
    evaluate: bool = False
    overwrite: bool = False
    reuse_secret: bool = False
    evaluation_output: Path | None = None  # None: <output>.evaluation


def release_choices(args: Any) -> dict[str, Any]:
    """``ReleaseChoices``' values in ``args`` (the parsed command line), by name."""
    return {f.name: getattr(args, f.name) for f in fields(ReleaseChoices)}


def evaluation_dir_for(output: Path) -> Path:
    """The default evaluation folder of a release at ``output``: beside it, never inside it."""
    return output.parent / f"{output.name}.evaluation"


class Clock:
    """One clock per run: stage wall times, logged as they end (no counts of people)."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.timings: dict[str, float] = {}

    def lap(self, name: str, detail: str = "") -> None:
        """End stage ``name`` now; repeated names are summed (e.g. certificate rounds)."""
        now = time.perf_counter()
        spent = now - self.last
        self.timings[name] = self.timings.get(name, 0.0) + spent
        self.last = now
        log.info("%s: %.1f s%s", name, spent, f" ({detail})" if detail else "")

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


@dataclass(frozen=True)
class SecretSource:
    """Where a user secret comes from (``file`` and ``env`` both None: generate one per fresh
    run). ``env`` is the config's ``[run] secret_env``; ``file`` is the file named on the command
    line (``--secret-file``, or an API call's ``secret_file``) when ``named``, else the config's
    ``[run] secret_file``.

    Precedence, decided by :meth:`read`:

    * a file named on the command line while the config's variable is also set: the two must
      hold the same secret, which is then used; different secrets are refused in one line, so
      a variable left set in a shell never silently replaces the file the command names (nor
      the file the variable). A named file that does not exist is refused, whatever the
      variable holds;
    * otherwise the variable, when set, is read before the config's own ``secret_file`` (the
      config names both, so the variable is its override), and that file after.
    """

    file: Path | None
    env: str | None
    named: bool = False

    @property
    def user_supplied(self) -> bool:
        return self.file is not None or self.env_set

    @property
    def env_set(self) -> bool:
        return self.env is not None and self.env in os.environ

    def read(self, private_dir: Path) -> bytes:
        """The user secret under the precedence above; a ``SecretError`` in one line for a
        missing or group-readable file, or a named file and the variable that disagree (each
        named by its fingerprint, never by its value). A malformed secret is a ``ValueError``
        naming its source."""
        if self.file is not None and not self.file.exists() and (self.named or not self.env_set):
            raise SecretError(f"{self.file}: secret file not found")
        try:
            if not (self.named and self.env_set):
                return load_or_create_secret(self.file, self.env, private_dir)
            named = load_or_create_secret(self.file, None, private_dir)
            from_env = load_or_create_secret(None, self.env, private_dir)
        except PermissionError as err:  # a group- or world-readable secret file: one line
            raise SecretError(str(err)) from None
        if not hmac.compare_digest(named, from_env):
            raise SecretError(
                f"--secret-file {self.file} (secret {secret_fingerprint(named)}) and the"
                f" environment variable {self.env} of [run] secret_env (secret"
                f" {secret_fingerprint(from_env)}) hold different secrets: unset {self.env} or"
                " leave out --secret-file"
            )
        return named


class ReleaseRun:
    """One release's run: use as a context manager around the whole job.

    On entry it checks the output (refused when it is a symbolic link or a file, is one of the
    ``inputs``, holds one or lies inside one, holds anything and neither ``overwrite`` nor
    ``resume`` is set, or holds files censusdp did not write and ``overwrite`` is set), takes
    the lock on the private folder and, for ``resume``, checks the run state against
    ``contents``. The secret is read or made only by :meth:`secret`, to be called once the
    input has passed validation; :meth:`prepare_output` empties the output just before the first
    write, and :meth:`write_manifest` ends the release.

    ``streams`` names the family of noise streams the release draws from (default: the release
    kind); a secret is bound once per family, since distinct families share no stream.

    With ``evaluate``, the evaluation against the truth goes to :meth:`evaluation_folder`
    (``evaluation_output``, default ``<output>.evaluation``), checked on entry like the output.

    Without a ``secret_source`` the run post-processes noisy measurements it was given: it
    draws no noise, so no secret is read, made or bound, and its state and manifest say so
    (``NO_SECRET``).
    """

    def __init__(
        self,
        release: str,
        output: Path,
        private_dir: Path,
        secret_source: SecretSource | None,
        contents: ReleaseContents,
        *,
        inputs: Sequence[Path] = (),
        overwrite: bool = False,
        resume: bool = False,
        reuse_secret: bool = False,
        streams: str | None = None,
        evaluate: bool = False,
        evaluation_output: Path | None = None,
    ) -> None:
        self.release = release
        self.streams = streams or release
        self.output = output
        self.private_dir = private_dir
        self.secret_source = secret_source
        self.contents = contents
        self.measurement_sha256 = contents.measurement_sha256
        self.inputs = tuple(inputs)
        self.overwrite = overwrite
        self.resume = resume
        self.reuse_secret = reuse_secret
        self.evaluate = evaluate
        self.evaluation_dir = evaluation_output or evaluation_dir_for(output)
        self.clock = Clock()
        self.state: RunState | None = None
        self._secret: bytes | None = None
        self._lock: IO[str] | None = None
        self._made_private_dir = False

    @classmethod
    def of(
        cls,
        release: str,
        run: RunOptions,
        contents: ReleaseContents,
        flags: ReleaseFlags,
        inputs: Sequence[Path],
        streams: str | None = None,
    ) -> ReleaseRun:
        """The runner of a release of ``run`` (command line applied) with ``flags``, reading
        ``inputs``; a release without ``--resume`` has no ``resume`` flag."""
        return cls(
            release,
            run.output,
            run.private_dir,
            SecretSource(run.secret_file, run.secret_env, named=flags.secret_file is not None),
            contents,
            inputs=inputs,
            overwrite=flags.overwrite,
            resume=bool(getattr(flags, "resume", False)),
            reuse_secret=flags.reuse_secret,
            streams=streams,
            evaluate=flags.evaluate,
            evaluation_output=flags.evaluation_output,
        )

    def __enter__(self) -> ReleaseRun:
        self._check_output_folder()
        if self.evaluate:
            self._check_evaluation_folder()
        self._take_lock()
        try:
            if self.resume:
                self.state = self._resumable_state()
        except BaseException as error:
            self.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the descriptor releases the lock
            self._lock = None
        # A failed run that made its private folder leaves none behind (nothing but the lock).
        if error is not None and self._made_private_dir and self.state is None:
            leftovers = {p.name for p in self.private_dir.iterdir()}
            if leftovers <= {"lock"}:
                shutil.rmtree(self.private_dir)

    # -- the secret ---------------------------------------------------------------------------

    def secret(self) -> bytes:
        """The run secret under the policy in the module docstring (read or made once)."""
        if self.secret_source is None:
            raise RuntimeError("a post-processing run draws no noise: it has no secret")
        if self._secret is None:
            self._secret = self._load_secret()
            if self.state is not None and self.state.secret_fingerprint != secret_fingerprint(
                self._secret
            ):
                raise ResumeError(
                    f"{RunState.path(self.private_dir)}: the run was started with another secret"
                )
        return self._secret

    def _secret_fingerprint(self) -> str:
        return NO_SECRET if self.secret_source is None else secret_fingerprint(self.secret())

    @property
    def for_release(self) -> bool:
        return not self.reuse_secret

    def _load_secret(self) -> bytes:
        source = self.secret_source
        assert source is not None, "a post-processing run has no secret"
        if not source.user_supplied:
            generated = self.private_dir / SECRET_FILE_NAME
            if not self.resume:
                generated.unlink(missing_ok=True)
            return load_or_create_secret(None, None, self.private_dir)
        secret = source.read(self.private_dir)
        if not self.resume:
            self._bind(secret)
        return secret

    def _bind(self, secret: bytes) -> None:
        """Record this release under the secret's fingerprint, or refuse a second release."""
        fingerprint = secret_fingerprint(secret)
        registry = Path(os.environ.get(REGISTRY_ENV, Path.home() / ".censusdp/secret_bindings"))
        registry.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = registry / f"{fingerprint}.json"
        with open(registry / f"{fingerprint}.lock", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            bindings = json.loads(target.read_text()) if target.exists() else {}
            bound = bindings.get(self.streams)
            if bound is not None and bound["measurement_sha256"] != self.measurement_sha256:
                if not self.reuse_secret:
                    raise SecretReuseError(
                        f"the secret {fingerprint} already made a {self.streams} release of"
                        f" another input or config ({bound['output']}); the same noise on"
                        " changed data would reveal the change: pass a new secret, or --resume"
                        " to continue that run"
                    )
                return  # an experiment: nothing recorded, the manifest says not for release
            if bound is None:
                bindings[self.streams] = {
                    "measurement_sha256": self.measurement_sha256,
                    "output": str(self.output),
                    "bound_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                tmp = target.with_suffix(".tmp")
                tmp.write_text(json.dumps(bindings, indent=2))
                os.replace(tmp, target)

    # -- output, state ------------------------------------------------------------------------

    def prepare_output(self) -> RunState:
        """Empty the output (a fresh run) and record the run state; returns it."""
        if self.state is not None:
            return self.state
        if _holds_anything(self.output):
            if not _written_by_censusdp(self.output):  # checked on entry; raced since
                raise OutputExistsError(self._foreign_output())
            shutil.rmtree(self.output)
        self._drop_stale_evaluation()
        self.output.mkdir(parents=True, exist_ok=True)
        (self.output / RELEASE_MARKER).write_text(f"{self.release}\n")
        self.state = RunState(
            release=self.release,
            output=str(self.output),
            parts=self.contents.fingerprints(),
            secret_fingerprint=self._secret_fingerprint(),
        )
        self.state.save(self.private_dir)
        return self.state

    def evaluation_folder(self) -> Path:
        """The evaluation folder, emptied (only an earlier one censusdp wrote is removed) and
        marked with the release it evaluates; call once the release's tables are written."""
        assert self.evaluate and self.state is not None, "prepare_output first, with evaluate"
        folder = self.evaluation_dir
        if _holds_anything(folder):
            if not (folder / EVALUATION_MARKER).exists():  # checked on entry; raced since
                raise OutputExistsError(self._foreign_evaluation())
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        marker = {
            "release_kind": self.release,
            "evaluates": str(self.output),
            "measurement_sha256": self.measurement_sha256,
            "note": "errors against the confidential truth: internal, never for release",
        }
        (folder / EVALUATION_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        return folder

    def _check_evaluation_folder(self) -> None:
        if self.evaluation_dir.is_symlink():
            raise OutputExistsError(self._symlink(self.evaluation_dir, "--evaluation-output"))
        folder, output = self.evaluation_dir.resolve(), self.output.resolve()
        if folder == output or output in folder.parents:
            raise OutputExistsError(
                f"{self.evaluation_dir}: the evaluation against the truth must not be inside the"
                f" release folder {self.output}; choose an --evaluation-output beside it"
            )
        if folder.exists() and not folder.is_dir():
            raise OutputExistsError(f"{self.evaluation_dir}: --evaluation-output is a file")
        if not _holds_anything(folder):
            return
        if not (folder / EVALUATION_MARKER).exists():
            raise OutputExistsError(self._foreign_evaluation())
        if not (self.overwrite or self.resume):
            raise OutputExistsError(
                f"{self.evaluation_dir}: an earlier evaluation is there; pass --overwrite to"
                " replace it (or --resume)"
            )

    def _foreign_evaluation(self) -> str:
        return (
            f"{self.evaluation_dir}: holds files censusdp did not write (no {EVALUATION_MARKER});"
            " choose another --evaluation-output"
        )

    def _drop_stale_evaluation(self) -> None:
        """A fresh run replaces the release at its output: an evaluation censusdp wrote of the
        release there before (or, with ``evaluate``, the one in the folder this run writes to)
        no longer describes anything released."""
        folder = self.evaluation_dir
        marker = folder / EVALUATION_MARKER
        if not marker.exists():
            return
        try:
            evaluates = json.loads(marker.read_text()).get("evaluates")
        except ValueError:
            evaluates = None
        if self.evaluate or evaluates == str(self.output):
            shutil.rmtree(folder)

    def commit(self, step: str) -> None:
        """Record ``step`` as committed (its table is written) so a resumed run skips it."""
        assert self.state is not None, "prepare_output first"
        if step == "measure":
            self.state.measured = True
        elif step not in self.state.steps_done:
            self.state.steps_done.append(step)
        self.state.save(self.private_dir)

    def redo(self, steps: Iterable[str]) -> None:
        """Forget that ``steps`` were committed (their tables were found missing or incomplete on
        resume), so this run computes them again."""
        assert self.state is not None, "prepare_output first"
        for step in steps:
            if step == "measure":
                self.state.measured = False
            elif step in self.state.steps_done:
                self.state.steps_done.remove(step)
        self.state.save(self.private_dir)

    def done(self, step: str) -> bool:
        return self.state is not None and (
            self.state.measured if step == "measure" else step in self.state.steps_done
        )

    def manifest_fields(self) -> dict[str, Any]:
        """The fields every release's manifest carries, its tables among them."""
        return {
            "release_kind": self.release,
            "for_release": self.for_release,
            "secret_fingerprint": self._secret_fingerprint(),
            "measurement_sha256": self.measurement_sha256,
            "contents_sha256": {p: _sha256(keys) for p, keys in self.contents.parts.items()},
            "timings_s": self.clock.timings,
            "elapsed_s": self.clock.elapsed(),
            "versions": versions(),
            "tables": self.contents.tables,
        }

    def write_manifest(
        self, content: Mapping[str, Any], more_versions: Mapping[str, str] | None = None
    ) -> None:
        """End the release: drop any Delta table of the output its manifest does not list (a
        folder holds exactly its manifest's tables), then write the manifest: ``content``, then
        :meth:`manifest_fields` with ``more_versions`` (packages this release used)."""
        for entry in sorted(self.output.iterdir()):
            if (entry / "_delta_log").is_dir() and entry.name not in self.contents.tables:
                log.info("%s: not a table of this release; removed", entry.name)
                shutil.rmtree(entry)
        common = self.manifest_fields()
        common["versions"].update(more_versions or {})
        write_manifest(self.output / "manifest.json", {**content, **common})

    def _check_output_folder(self) -> None:
        """Every refusal the output can meet, before anything is written or a secret made."""
        if self.output.is_symlink():
            raise OutputExistsError(self._symlink(self.output, "--output"))
        if self.output.exists() and not self.output.is_dir():
            raise OutputExistsError(f"{self.output}: --output is a file, not a folder")
        self._check_apart_from_inputs()
        parent = next((p for p in [self.output, *self.output.parents] if p.exists()), None)
        if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
            raise OutputExistsError(f"{parent}: not writable; choose another --output")
        if self.resume or not _holds_anything(self.output):
            return
        if not self.overwrite:
            raise OutputExistsError(
                f"{self.output}: output exists; pass --overwrite to replace it (or --resume)"
            )
        if not _written_by_censusdp(self.output):
            raise OutputExistsError(self._foreign_output())

    def _check_apart_from_inputs(self) -> None:
        """An output that is an input or holds one (``--overwrite`` would delete it), or lies
        inside an input folder (every later read of that folder would meet the release)."""
        output = self.output.resolve()
        for read in self.inputs:
            where = read.resolve()
            if output == where:
                rule = f"is the input {read}"
            elif output in where.parents:
                rule = f"the input {read} is inside it"
            elif where in output.parents:
                rule = f"is inside the input folder {read}"
            else:
                continue
            raise OutputExistsError(
                f"{self.output}: {rule}; choose an --output apart from every input"
            )

    def _foreign_output(self) -> str:
        return (
            f"{self.output}: --overwrite replaces only a folder written by censusdp"
            " (no manifest.json or marker here); choose another --output"
        )

    @staticmethod
    def _symlink(folder: Path, option: str) -> str:
        return (
            f"{folder}: {option} is a symbolic link; give the folder it points to"
            f" ({folder.resolve()}) or another {option}"
        )

    def _take_lock(self) -> None:
        self._made_private_dir = not self.private_dir.exists()
        self.private_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle = open(self.private_dir / "lock", "a")  # noqa: SIM115 - held for the whole run
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunLockedError(
                f"{self.private_dir}: another run holds this run's lock; wait for it to end"
            ) from None
        self._lock = handle

    def _resumable_state(self) -> RunState:
        state = RunState.load(self.private_dir)
        where = RunState.path(self.private_dir)
        if state is None:
            raise ResumeError(f"{where}: no run state to resume from")
        if state.release != self.release or state.output != str(self.output):
            raise ResumeError(f"{where}: the run was started for another release or output")
        changed = self.contents.changed(state.parts)
        keys = ", ".join(key for _, key in changed)
        if any(part in MEASURED_PARTS for part, _ in changed):
            raise ResumeError(
                f"{where}: the input or config changed since the run started ({keys}); resuming"
                " would mix noise of the old data with the new: start a fresh run with a new"
                " secret"
            )
        if changed:
            raise ResumeError(
                f"{where}: the release changed since the run started ({keys}); resuming would"
                " mix two releases in one folder: resume with the run's own config and options,"
                " or start a fresh run"
            )
        return state


def _holds_anything(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def _written_by_censusdp(folder: Path) -> bool:
    return (folder / RELEASE_MARKER).exists() or (folder / "manifest.json").exists()


def check_secret(run: RunOptions, secret_file: Path | None = None) -> str:
    """Read the secret a release of ``run`` would read, if it is already fixed (``secret_file``,
    named on the command line, or the config's), under :class:`SecretSource`'s precedence,
    and say how it was checked; create nothing, never print it. A missing, group-readable or
    malformed secret, or a named file and ``[run] secret_env`` holding different secrets, is a
    ``ValueError`` in one line."""
    source = SecretSource(secret_file or run.secret_file, run.secret_env, secret_file is not None)
    if not source.user_supplied:
        return "none given: a fresh run generates one in the private folder"
    try:
        source.read(run.private_dir)
    except SecretError as err:
        raise ValueError(str(err)) from None
    if source.named and source.env_set:
        return f"{source.file} and environment variable {source.env}: the same secret, well formed"
    if source.env_set:
        return f"from environment variable {source.env}: well formed"
    return f"{source.file}: owner-only, well formed"
