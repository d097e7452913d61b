set -x
# stage 8: dir0.1-lr0.0025 met (a) (47 / 43 / 49): its random cells
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name dir0.1-lr0.0025 --partition dirichlet --alpha 0.1 --lr 0.0025 --q 0.5 --seeds 0 1 2 --rounds 300
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name dir0.1-lr0.0025 --partition dirichlet --alpha 0.1 --lr 0.0025 --q 0.3 0.1 --seeds 0 1 2 --rounds 200
