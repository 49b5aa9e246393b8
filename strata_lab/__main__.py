from strata_lab.cli import main

raise SystemExit(main())
