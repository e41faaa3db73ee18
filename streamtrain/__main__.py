from streamtrain.cli import main

main()
