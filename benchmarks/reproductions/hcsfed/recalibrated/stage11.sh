set -x
# stage 11: between qp alpha 0.1 (fails (a) on seed 1) and 0.2: dirichlet-qp alpha 0.15, lr 0.02
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.15-lr0.02 --partition dirichlet-qp --alpha 0.15 --lr 0.02 --q 1 --seeds 1 0 2 --rounds 100
OK=$(.venv/bin/python -c "
import json
rows=[json.loads(l) for l in open('benchmarks/reproductions/hcsfed/recalibrated/candidates.jsonl') if l.strip()]
r=[x['rounds_to_80'] for x in rows if x['name']=='qp0.15-lr0.02' and x['q']==1.0]
print(int(len(r)==3 and all(v is not None and v<=60 for v in r)))")
if [ "$OK" = 1 ]; then
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.15-lr0.02 --partition dirichlet-qp --alpha 0.15 --lr 0.02 --q 0.5 --seeds 0 1 2 --rounds 300
nice -n 19 env PYTHONPATH=. .venv/bin/python benchmarks/reproductions/hcsfed/recalibrated/hcsfed_recalibrate.py --name qp0.15-lr0.02 --partition dirichlet-qp --alpha 0.15 --lr 0.02 --q 0.3 0.1 --seeds 0 1 2 --rounds 200
fi
