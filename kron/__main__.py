from kron.cli import main

main()
