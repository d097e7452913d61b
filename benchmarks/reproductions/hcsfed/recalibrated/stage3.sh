set -x
# stage 3 (after stage 2): qp alpha 0.1 (Dir(0.01)) at higher lr, full participation seed 0
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.1-lr0.02 --partition dirichlet-qp --alpha 0.1 --lr 0.02 --q 1 --seeds 0 --rounds 100
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.1-lr0.015 --partition dirichlet-qp --alpha 0.1 --lr 0.015 --q 1 --seeds 0 --rounds 100
