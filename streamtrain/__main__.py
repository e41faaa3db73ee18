"""`python -m streamtrain` and the `streamtrain` console script: the command line, and the one
module of the top package that imports the CLI (tests/unit/test_layers.py). A supervisor's
warm children call `main` too (`streamtrain.local.COMMAND`), having imported this module in the
fork server, so running it is left to `__main__`."""

from streamtrain.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
