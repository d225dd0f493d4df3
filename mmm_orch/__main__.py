from mmm_orch.cli import main

raise SystemExit(main())
