"""``python -m hf_icl.cli COMMAND ...`` (and ``accelerate launch -m hf_icl.cli train ...``)."""

import sys

from . import main

sys.exit(main())
