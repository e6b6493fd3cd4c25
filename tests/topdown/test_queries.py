import numpy as np
import pytest

from censusdp_spark.model.attribute import Attribute
from censusdp_spark.topdown.queries import parse_query
from censusdp_spark.topdown.schema import Recode, Schema

SCHEMA = Schema(
    (
        Attribute("hhgq", ("hh", "inst", "noninst", "mil")),
        Attribute("va", ("u18", "18p")),
        Attribute("race", tuple("abc")),
    ),
    (Recode("hhinst", "hhgq", ("hh", "gq"), (0, 1, 1, 1)),),
)


@pytest.mark.parametrize(
    "name", ["total", "detailed", "va", "hhgq * race", "va * race", "hhinst", "hhinst * va"]
)
def test_cell_to_marginal_equals_the_kronecker_product(name):
    query = parse_query(name, SCHEMA)
    matrix = query.matrix()
    assert matrix.shape == (query.size, SCHEMA.n_cells)
    assert (matrix.sum(axis=0) == 1).all()
    assert np.array_equal(np.argmax(matrix, axis=0), query.cell_to_marginal)


def test_answer_sums_cells_into_marginal_cells():
    rng = np.random.default_rng(0)
    hist = rng.integers(0, 5, SCHEMA.n_cells)
    query = parse_query("va * race", SCHEMA)
    cells = np.flatnonzero(hist)
    assert np.array_equal(query.answer(cells, hist[cells]), query.matrix() @ hist)


def test_cells_are_row_major_and_invertible():
    cells = np.arange(SCHEMA.n_cells)
    assert np.array_equal(SCHEMA.cell_of(SCHEMA.levels_of(cells)), cells)
    assert SCHEMA.cell_of([[1, 0, 2]])[0] == 1 * 6 + 0 * 3 + 2


@pytest.mark.parametrize(
    "name, message", [("va * sex", "unknown attribute"), ("hhgq * hhinst", "more than once")]
)
def test_bad_query_names_are_refused(name, message):
    with pytest.raises(ValueError, match=message):
        parse_query(name, SCHEMA)
