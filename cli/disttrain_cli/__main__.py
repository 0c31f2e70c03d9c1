import sys

from disttrain_cli import main

sys.exit(main())
