try:
    from torchbay.cli import main
except KeyboardInterrupt:  # Ctrl-C as the interpreter starts: as torchbay.cli.main answers it
    raise SystemExit(130) from None

raise SystemExit(main())
