set -x
# stage 2 (after stage 1): the candidate that passed (a) on seed 0, all cells; random caps: 200 at q = 0.1/0.3 (a cell >= 200 adds 0 to (b)), 300 at q = 0.5
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name dir0.1-lr0.005 --partition dirichlet --alpha 0.1 --lr 0.005 --q 1 --seeds 0 1 2 --rounds 100
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name dir0.1-lr0.005 --partition dirichlet --alpha 0.1 --lr 0.005 --q 0.5 --seeds 0 1 2 --rounds 300
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name dir0.1-lr0.005 --partition dirichlet --alpha 0.1 --lr 0.005 --q 0.3 0.1 --seeds 0 1 2 --rounds 200
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name dir0.1-lr0.0025 --partition dirichlet --alpha 0.1 --lr 0.0025 --q 1 --seeds 0 --rounds 100
