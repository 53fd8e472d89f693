from segood.cli import main

raise SystemExit(main())
