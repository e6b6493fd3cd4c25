"""Privacy core: exact noise samplers, keyed random streams and the run secret, a noise group's
measurements noised from one stream, exact budget accounting, privacy-loss conversions and a
release's privacy unit.

Nothing here knows about Spark or the census schema; every module states its privacy claim.
"""

from censusdp_spark.privacy.conversions import (
    approx_dp_to_zcdp,
    bounded_range_epsilon,
    bun_steinke_epsilon,
    zcdp_to_approx_dp,
)
from censusdp_spark.privacy.noise_groups import noisy_measurements
from censusdp_spark.privacy.samplers import (
    bernoulli_exp_minus,
    discrete_gaussian,
    discrete_gaussian_pmf,
    discrete_gaussian_rows,
    discrete_gaussian_variance,
    discrete_laplace,
    exponential_mechanism,
)
from censusdp_spark.privacy.streams import keyed_rng, load_or_create_secret, secret_fingerprint

__all__ = [
    "approx_dp_to_zcdp",
    "bernoulli_exp_minus",
    "bounded_range_epsilon",
    "bun_steinke_epsilon",
    "discrete_gaussian",
    "discrete_gaussian_pmf",
    "discrete_gaussian_rows",
    "discrete_gaussian_variance",
    "discrete_laplace",
    "exponential_mechanism",
    "keyed_rng",
    "load_or_create_secret",
    "noisy_measurements",
    "secret_fingerprint",
    "zcdp_to_approx_dp",
]
