import sys

from convergerd.cli.main import main

sys.exit(main())
