import sys

from specbench.cli import main

sys.exit(main())
