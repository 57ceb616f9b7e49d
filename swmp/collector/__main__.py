import sys

from swmp.collector.server import main

sys.exit(main())
