//! Inference through simulated networks of real engines: a 3-stage network generates what one
//! process generates from the same weights, token for token, while training goes on, and a
//! stream survives the loss of the replicas holding its caches.

use std::time::Duration;

use neuroshard_model::{Generator, ModelConfig, ParamSet, Sampling, Stage, StageSpec};
use neuroshard_node::serve::{Completion, Finish, SampleSpec, ServeEvent};
use neuroshard_sim::{Sim, real_network, serving_model, settings};

const STAGES: usize = 3;

fn model() -> ModelConfig {
    serving_model(3)
}

/// `replicas` per stage, node i in stage i % 3; DiLoCo rounds far apart, so θ₀ stays where it
/// started while the inner weights train.
fn sim(replicas: usize) -> Sim {
    let mut s = settings(model(), STAGES, replicas);
    s.seq = 8;
    s.sync.every = 10_000;
    let mut sim = real_network(5, s, replicas);
    sim.run_until(Duration::from_secs(5));
    sim
}

/// The whole model from θ₀ of one replica per stage, as one process would load it.
fn whole_model(sim: &Sim) -> Generator {
    let config = model();
    let values: Vec<Vec<f32>> = (0..STAGES)
        .flat_map(|stage| {
            let node = (0..sim.len())
                .find(|&i| i % STAGES == stage && sim.is_up(i))
                .expect("a live replica");
            let engine = sim.engine(node).expect("up");
            let spec = StageSpec::split(&config, STAGES).unwrap()[stage];
            let mut p = ParamSet::init(spec.param_specs(&config), 0);
            p.set_flat(&engine.theta().expect("DiLoCo on")).unwrap();
            p.values().to_vec()
        })
        .collect();
    let full = StageSpec::full(&config);
    let params = ParamSet::from_values(full.param_specs(&config), values).unwrap();
    Generator::new(Stage::from_params(config, full, params).unwrap()).unwrap()
}

fn request(max_tokens: usize) -> (Completion, Sampling) {
    let sample = SampleSpec {
        temperature: 0.9,
        top_p: 0.9,
        top_k: 0,
        seed: 42,
        draws: 0,
    };
    let c = Completion {
        prompt: vec![3, 17, 9, 1],
        max_tokens,
        sample,
        stop_token: None,
        payment: None,
    };
    (c, sample.sampling())
}

fn tokens(sim: &Sim, node: usize, stream: u64) -> (Vec<u32>, Option<&ServeEvent>) {
    let evs: Vec<&ServeEvent> = sim
        .served(node)
        .iter()
        .filter(|e| e.stream() == stream)
        .collect();
    let toks = evs
        .iter()
        .filter_map(|e| match e {
            ServeEvent::Token { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    let end = evs
        .into_iter()
        .find(|e| !matches!(e, ServeEvent::Token { .. }));
    (toks, end)
}

fn steps(sim: &Sim) -> u64 {
    (0..sim.len())
        .step_by(STAGES)
        .filter_map(|i| sim.core(i).map(|c| c.steps_done()))
        .sum()
}

#[test]
fn three_stages_generate_what_one_process_generates_while_training_goes_on() {
    let mut sim = sim(2);
    let before = steps(&sim);
    // The request enters at a middle-stage node, which coordinates it.
    let (req, sampling) = request(12);
    let a = sim.open_stream(1, req.clone()).unwrap();
    // No limit but the context: the stream ends at max_seq.
    let b = sim.open_stream(4, request(usize::MAX).0).unwrap();
    sim.run_until(Duration::from_secs(25));
    let want = whole_model(&sim)
        .generate(&req.prompt, 12, &sampling)
        .unwrap();
    let (got, end) = tokens(&sim, 1, a);
    assert_eq!(got, want);
    assert_eq!(
        end,
        Some(&ServeEvent::Finished {
            stream: a,
            reason: Finish::Length
        })
    );
    let (long, end) = tokens(&sim, 4, b);
    assert_eq!(long.len(), model().max_seq - req.prompt.len());
    assert_eq!(long[..12], want[..], "same seed, same tokens");
    assert!(matches!(end, Some(ServeEvent::Finished { .. })), "{end:?}");
    assert!(steps(&sim) > before + 10, "training stalled while serving");
}

#[test]
fn a_stream_completes_when_the_replicas_holding_its_caches_die() {
    let mut sim = sim(3);
    let (req, sampling) = request(16);
    let coordinator = 0;
    let id = sim.open_stream(coordinator, req.clone()).unwrap();
    let mut t = Duration::from_secs(5);
    while tokens(&sim, coordinator, id).0.len() < 4 {
        t += Duration::from_millis(50);
        assert!(t < Duration::from_secs(20), "no tokens");
        sim.run_until(t);
    }
    let holders = sim
        .core(coordinator)
        .unwrap()
        .stream_holders(id)
        .expect("still running");
    let mut killed = Vec::new();
    for holder in &holders[1..] {
        let holder = holder.expect("a holder");
        let i = (0..sim.len()).find(|&i| sim.node_id(i) == holder).unwrap();
        sim.crash_at(i, t + Duration::from_millis(1));
        killed.push(i);
    }
    sim.run_until(t + Duration::from_secs(40));
    let (got, end) = tokens(&sim, coordinator, id);
    assert_eq!(
        end,
        Some(&ServeEvent::Finished {
            stream: id,
            reason: Finish::Length
        })
    );
    let now = sim.core(coordinator).unwrap().stream_holders(id);
    assert!(now.is_none());
    // The replay feeds the new replicas the same chunks: the same caches, the same tokens.
    let want = whole_model(&sim)
        .generate(&req.prompt, 16, &sampling)
        .unwrap();
    assert_eq!(got, want, "killed {killed:?}");
}
