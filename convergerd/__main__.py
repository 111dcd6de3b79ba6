import sys

from convergerd.cli import main

sys.exit(main())
