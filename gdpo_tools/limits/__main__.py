from gdpo_tools.limits.generate import main

raise SystemExit(main())
