"""``python -m torchbay.server.worker --fd N``: the worker process's entry point."""

from torchbay.server.worker.exits import exit_now
from torchbay.server.worker.main import main

exit_now(main())
