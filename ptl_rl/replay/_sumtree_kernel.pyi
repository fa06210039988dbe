# Type stub of the optional compiled sum-tree loops (_sumtree_kernel.c): mypy cannot read an extension module.
import numpy as np
import numpy.typing as npt

def descend(
    sums: npt.NDArray[np.float64], nodes: npt.NDArray[np.int64], rest: npt.NDArray[np.float64], levels: int, /
) -> None:
    """From top-level ``nodes`` (int64 [B]) descend ``levels`` levels to the leaf holding each ``rest`` (float64 [B]).

    ``nodes`` and ``rest`` are updated in place: the leaf node and what is left of the target.
    """

def repair(
    sums: npt.NDArray[np.float64], maxes: npt.NDArray[np.float64], nodes: npt.NDArray[np.int64], top: int, /
) -> None:
    """Recompute the sums and maxima of the parents of leaf ``nodes`` (int64 [U]) up to the top level (``top``)."""
