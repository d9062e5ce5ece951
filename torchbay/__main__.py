from torchbay.cli import main

raise SystemExit(main())
