import sys

from kiln.tools.__main__ import main

sys.exit(main())
