import sys

from embedgate.cli import main

sys.exit(main())
