"""``python -m celery_fair.simulate TRACE [--slots N] [--policy fifo,wfq] [--plot out.png]``."""

from .command import main

main(prog_name="python -m celery_fair.simulate")
