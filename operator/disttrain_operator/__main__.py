import sys

from disttrain_operator.cli import main

sys.exit(main())
