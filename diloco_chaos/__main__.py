"""`python -m diloco_chaos COMMAND ...`, the same as the `diloco-chaos` script."""
import sys

from diloco_chaos.cli import main

sys.exit(main())
