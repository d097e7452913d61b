set -x
# stage 1: full participation, seed 0, cap 100 (cheap rejection). Run first: qp0.01-lr0.005 (done), qp0.01-lr0.0025 (stopped: slower than lr 0.005, which missed 100)
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.01-lr0.01 --partition dirichlet-qp --alpha 0.01 --lr 0.01 --q 1 --seeds 0 --rounds 100
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.01-lr0.02 --partition dirichlet-qp --alpha 0.01 --lr 0.02 --q 1 --seeds 0 --rounds 100
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name dir0.1-lr0.005 --partition dirichlet --alpha 0.1 --lr 0.005 --q 1 --seeds 0 --rounds 100
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.1-lr0.01 --partition dirichlet-qp --alpha 0.1 --lr 0.01 --q 1 --seeds 0 --rounds 100
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.01-lr0.05 --partition dirichlet-qp --alpha 0.01 --lr 0.05 --q 1 --seeds 0 --rounds 100
