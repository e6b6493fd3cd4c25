"""The Census Noisy Measurement File (NMF) layout, as Google's BlueDown reads it (no Spark here).

What the layout is (learned from ``google-research/census-bluedown``: ``census_bluedown/io.py``
``InputFormatIO`` and ``get_input_format_io``, ``constants.py``, ``linear_postprocessing.py``,
``block.py``, ``constrain.py``, ``ground_truth.py``, ``root.py``):

- **Folders.** One folder per level, ``<Level>.parquet``, the levels named ``US``, ``State``,
  ``County``, ``Tract``, ``Block_Group``, ``Block`` (``constants.ROOT_LEVEL``, ``LEVELS``). Under
  it ``DPQuery/`` holds the noisy measurements and ``Constraint/`` the exact constraints
  (``NMF_PATH_SUFFIX``, ``CONSTRAINT_PATH_SUFFIX``). Every level but the root is split into
  Spark-style partition folders ``State=<code>/`` (``SUBTREE_FOLDER_PATTERN``); the root's rows
  lie directly in ``US.parquet/DPQuery/``. BlueDown reads *the one file* of such a folder, and
  refuses a folder holding more than one (so no ``_SUCCESS`` or ``.crc`` beside it).
- **State code.** In the Census file a 3-character code: the AIAN flag (``0``/``1``) and the
  state FIPS code (``FOLDER_IDS_2020``: ``001``, ..., ``156``).
- **Geocode** (column ``geocode``, ``constants.ID``): a node's code; a parent's geocode is the
  fixed-length prefix of its children's (BlueDown finds parents by ``str[:len(parent)]``). The
  Census's are 3, 9, 13, 15 and 31 characters from State to Block
  (``compute_errors.GEO_LENGTH_BY_LEVEL``): the AIAN flag leads, the last 16 of a block's are
  the tabulation block ``geocode16``.
- **DPQuery rows**: one per (geocode, query) with ``query_name`` (``"detailed_dpq"``,
  ``"hhinstlevels_dpq"``, ...: the query's name and ``_dpq``), ``query_shape`` (per attribute,
  how many marginal rows it keeps: 1 where summed out, the attribute's size where kept, a
  recode's group count for a recode; ``DETAILED_QUERY_SHAPE = (8, 2, 2, 63)`` is hhgq,
  votingage, hispanic, cenrace), ``value`` (the noisy counts of every cell of the query's
  marginal, flattened row-major: ``ground_truth.aggregate_query_values`` reshapes a detailed
  vector to ``(8, 2, 2, 63)`` and sums axes out, ``block.py`` builds design rows as Kronecker
  products in attribute order) and ``variance`` (one number: every cell's noise variance).
- **Constraint rows**: ``geocode, query_name, value`` with names ending ``_con``
  (``hhgq_total_lb_con``, ``hhgq_total_ub_con``: 8 bounds per node, read by
  ``constrain.py`` and ``root.py``). BlueDown takes the state populations from a separate
  ``state_totals.parquet`` (``geocode, name, value``), not from the NMF.

What we write and read: ``DPQuery`` rows ``geocode string, query_name string, query_shape
array<int>, value array<bigint>, variance double`` plus ``sigma2 string``, the exact variance as
a fraction (a column BlueDown does not read; the reader prefers it to ``variance``); and
``Constraint`` rows ``geocode, query_name = "total_con", sign = "=", query_shape = [1, ...],
value = [total], variance = 0`` for every node whose total is held exact (``total_con`` is our
name, in the ``_con`` naming of the Census's constraints), and an empty ``Constraint`` folder
where a level has no totals (BlueDown lists a level's Constraint folder before reading it: it
must be there). Each folder holds one Parquet file and nothing else. The reader ignores
constraint rows of other names (the Census's hhgq bounds); our runs have none of those, so
BlueDown's constrained steps, which need them, cannot run on a file of ours.

Our level names map to the NMF's by position (root first): a hierarchy of 6 levels is written as
US, State, ..., Block, whatever its own names; any other shape is refused. The geocode is ours,
verbatim (the root's is empty), and the ``State`` folder is the node's geocode prefix at the
second level. A config whose levels have the Census's lengths (``digits`` 0, 3, 9, 13, 15, 31:
the state's 3 are the AIAN flag and the FIPS code) gives the Census's own folder names and is
the one to read the Census's file with. BlueDown's code does not show the geocode of the
Census's root row (it passes ``root_geocode=''`` to its solver); ours is empty, and a root row
with another geocode is refused (not tried on the Census's file itself).

A state-by-state read (``state_folders``) opens one state's ``State=<code>`` folder of each
level below the root, DPQuery and Constraint, and nothing else: the subtree BlueDown's per-state
passes read (``run_pass.py --state``, whose IO objects are pointed at ``State=<code>``).

Cell order: row-major over the schema's attributes in config order (the last fastest), which is
``numpy.ravel`` of the marginal as an array of shape ``query_shape`` and the order of the
Kronecker product of per-attribute matrices (``topdown.queries``: ``cell_to_marginal``); the
reader checks each query's ``query_shape`` against the config's, so a file whose attributes
come in another order is refused rather than read scrambled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from censusdp_spark.model.errors import ConfigError
from censusdp_spark.topdown.config import TopDownConfig

NMF_LEVELS = ("US", "State", "County", "Tract", "Block_Group", "Block")
"""The NMF's level folder names, root first (BlueDown's ``ROOT_LEVEL`` and ``LEVELS``)."""
STATE_LEVEL = 1  # the NMF's partition folders are named after the node's ancestor at this level
STATE_PARTITION = "State"
LEVEL_SUFFIX = ".parquet"
DPQUERY = "DPQuery"
CONSTRAINT = "Constraint"
KINDS = (DPQUERY, CONSTRAINT)
DPQ_SUFFIX = "_dpq"
TOTAL_CONSTRAINT = "total_con"
DPQUERY_COLUMNS = ("geocode", "query_name", "query_shape", "value", "variance")
CONSTRAINT_COLUMNS = ("geocode", "query_name", "value")
EXACT_VARIANCE = "sigma2"
"""Our extra DPQuery column: the variance as an exact fraction (text), read back before
``variance`` when present."""


@dataclass(frozen=True)
class NmfQuery:
    """One configured query of one level, as the NMF names and shapes it."""

    level: str  # ours
    name: str  # ours, as the config spells it
    key: str  # ``query_key`` of the name: how a file's query_name is matched to it
    cells: int
    shape: tuple[int, ...]  # per schema attribute, in config order


def nmf_level_names(config: TopDownConfig) -> dict[str, str]:
    """Our level names to the NMF's, by position; a hierarchy of other than 6 levels is refused."""
    names = config.hierarchy.names
    if len(names) != len(NMF_LEVELS):
        raise ConfigError(
            config.source,
            "geography.levels",
            f"the NMF layout has {len(NMF_LEVELS)} levels ({', '.join(NMF_LEVELS)}), mapped to"
            f" ours by position; this hierarchy has {len(names)} ({', '.join(names)})",
        )
    return dict(zip(names, NMF_LEVELS, strict=True))


def level_folder(root: Path, nmf_level: str, kind: str) -> Path:
    """``<root>/<Level>.parquet/<kind>``: a level's DPQuery or Constraint folder."""
    return root / f"{nmf_level}{LEVEL_SUFFIX}" / kind


def state_folder(root: Path, nmf_level: str, kind: str, state: str) -> Path:
    """``<root>/<Level>.parquet/<kind>/State=<state>``: one state's part of a level's folder."""
    return level_folder(root, nmf_level, kind) / f"{STATE_PARTITION}={state}"


def state_folders(root: Path, config: TopDownConfig, states: tuple[str, ...]) -> list[Path]:
    """Every folder a run of ``states`` reads: their ``State=`` folders of each level below the
    root, DPQuery and Constraint (the root's folder, the nation's, is not among them)."""
    names = list(nmf_level_names(config).values())[STATE_LEVEL:]
    return [
        state_folder(root, level, kind, state)
        for state in states
        for level in names
        for kind in KINDS
    ]


def root_folders(root: Path, config: TopDownConfig) -> list[Path]:
    """The root level's DPQuery and Constraint folders (the nation's measurements and total):
    all that assembling the nation from state runs reads of the file."""
    name = nmf_level_names(config)[config.hierarchy.root.name]
    return [level_folder(root, name, kind) for kind in KINDS]


def query_key(name: str) -> str:
    """A query name without a trailing ``_dpq`` and with its factors as ``a * b``: the file's and
    the config's spellings of one query give the same key."""
    bare = re.sub(f"{DPQ_SUFFIX}$", "", name.strip())
    return " * ".join(part.strip() for part in bare.split("*"))


def dpq_name(query: str) -> str:
    """The NMF's ``query_name`` of one of our queries."""
    return f"{query}{DPQ_SUFFIX}"


def nmf_queries(config: TopDownConfig) -> tuple[NmfQuery, ...]:
    """Every level's configured queries with their cell counts and NMF query shapes."""
    return tuple(
        NmfQuery(
            level,
            q.name,
            query_key(q.name),
            q.size,
            tuple(int(m.shape[0]) for m in q.factor_matrices),
        )
        for level in config.hierarchy.names
        for q in config.queries[level]
    )


def exact_variance(variance: float) -> str:
    """The exact value of a file's float variance as fraction text (a double is a dyadic
    rational: ``Fraction(0.1)`` is 3602879701896397/36028797018963968, not 1/10)."""
    return str(Fraction(variance))
