set -x
# stage 5: qp0.1-lr0.015 failed (a) on seed 1 (63 rounds; stage 4 stopped during its random q = 0.5 seed 0);
# the full candidate is qp0.1-lr0.02
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.1-lr0.02 --partition dirichlet-qp --alpha 0.1 --lr 0.02 --q 1 --seeds 0 1 2 --rounds 100
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.1-lr0.02 --partition dirichlet-qp --alpha 0.1 --lr 0.02 --q 0.5 --seeds 0 1 2 --rounds 300
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.1-lr0.02 --partition dirichlet-qp --alpha 0.1 --lr 0.02 --q 0.3 0.1 --seeds 0 1 2 --rounds 200
