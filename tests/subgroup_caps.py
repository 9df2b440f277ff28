"""Which store backends have caps per subgroup (``fair_subgroup = "path"``, a cap keyed
"<group>/<subgroup>"): every one (SQL since revision 0017)."""

from .backends import BACKENDS

#: The backends with caps per subgroup.
CAPPED = BACKENDS
