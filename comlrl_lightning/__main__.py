from comlrl_lightning.cli import main

main()
