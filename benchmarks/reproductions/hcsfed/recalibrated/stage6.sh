set -x
# stage 6: qp0.1-lr0.02 failed (a) on seed 1 (61 rounds); screen on the slow seed 1 first
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.1-lr0.03 --partition dirichlet-qp --alpha 0.1 --lr 0.03 --q 1 --seeds 1 0 2 --rounds 100
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name dir0.1-lr0.0025 --partition dirichlet --alpha 0.1 --lr 0.0025 --q 1 --seeds 1 2 --rounds 100
