"""Where the repository's parts are, for tests in any folder of tests/."""

from pathlib import Path

#: the repository's root (README.md, hf_icl/, scripts/, models/)
REPO = Path(__file__).resolve().parent.parent
