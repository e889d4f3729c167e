//! The model's sizes, parsed once from the checkpoint's `args` into a typed struct.

use serde_json::Value;

/// Sizes of a TESSERA v2 pixel student. Always read from the checkpoint's
/// `args`, never assumed: the published Large student is latent 160, 4 layers,
/// 4 heads, FFN 2560 (43,831,170 parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    pub latent_dim: usize,
    pub num_layers: usize,
    pub nhead: usize,
    pub dim_feedforward: usize,
    /// Output width (128 in every published model).
    pub repr_dim: usize,
}

/// Bands of the S2 backbone input (B04 B02 B03 B08 B8A B05 B06 B07 B11 B12).
pub const S2_BANDS: usize = 10;
/// Bands of the S1 backbone input (VV, VH).
pub const S1_BANDS: usize = 2;
/// Longest sequence a pixel is given (upstream `max_seq_len`).
pub const MAX_SEQ_LEN: usize = 256;

/// Caps on the sizes a checkpoint's `args` may declare, so that no size
/// arithmetic overflows and a header cannot make the loader plan for more
/// than a real model: the published Large student is latent 160, 4 layers,
/// 4 heads, FFN 2560, repr 128; each cap is 16x or more.
const MAX_SIZES: [(&str, usize); 5] = [
    ("latent_dim", 4_096),
    ("num_layers", 64),
    ("nhead", 256),
    ("dim_feedforward", 65_536),
    ("repr_dim", 4_096),
];

impl ModelConfig {
    /// Width of each backbone's token, `4 * latent_dim`.
    pub fn d_model(&self) -> usize {
        4 * self.latent_dim
    }
    pub fn head_dim(&self) -> usize {
        self.d_model() / self.nhead
    }

    /// Parse the upstream `args` dict (as JSON). Unknown keys are ignored
    /// (upstream stores training options there too).
    pub fn from_json(args: &Value) -> Result<Self, String> {
        let get = |k: &str| -> Result<usize, String> {
            let v = args.get(k).ok_or_else(|| format!("args has no `{k}`"))?;
            let n = v
                .as_u64()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("args `{k}` = {v} is not a positive integer"))?;
            let cap = MAX_SIZES
                .iter()
                .find(|(name, _)| *name == k)
                .map_or(usize::MAX, |&(_, cap)| cap);
            usize::try_from(n)
                .ok()
                .filter(|&n| n <= cap)
                .ok_or_else(|| format!("args `{k}` = {n}, at most {cap}"))
        };
        let repr_dim = match args.get("repr_dim") {
            None => 128,
            Some(_) => get("repr_dim")?,
        };
        let cfg = ModelConfig {
            latent_dim: get("latent_dim")?,
            num_layers: get("num_layers")?,
            nhead: get("nhead")?,
            dim_feedforward: get("dim_feedforward")?,
            repr_dim,
        };
        if !cfg.d_model().is_multiple_of(cfg.nhead) {
            return Err(format!(
                "d_model {} (4 x latent_dim) is not divisible by nhead {}",
                cfg.d_model(),
                cfg.nhead
            ));
        }
        if args.get("enable_qk_norm").and_then(Value::as_bool) == Some(true) {
            return Err("enable_qk_norm = true is not supported".into());
        }
        Ok(cfg)
    }

    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "repr_dim": self.repr_dim,
            "latent_dim": self.latent_dim,
            "num_layers": self.num_layers,
            "nhead": self.nhead,
            "dim_feedforward": self.dim_feedforward,
            "max_seq_len": MAX_SEQ_LEN,
            "enable_qk_norm": false,
        })
    }

    /// The published Large student's sizes.
    pub fn large() -> Self {
        ModelConfig {
            latent_dim: 160,
            num_layers: 4,
            nhead: 4,
            dim_feedforward: 2560,
            repr_dim: 128,
        }
    }

    /// The fixtures' small model (`shared/fixtures/encoder/small`, and
    /// `--size small`): latent 16, 2 layers, 4 heads, FFN 128.
    pub fn small() -> Self {
        ModelConfig {
            latent_dim: 16,
            num_layers: 2,
            nhead: 4,
            dim_feedforward: 128,
            repr_dim: 128,
        }
    }

    /// Every tensor name and shape a checkpoint of these sizes holds, in the
    /// upstream (PyTorch `state_dict`) naming.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let d = self.d_model();
        let f = self.dim_feedforward;
        let mut v: Vec<(String, Vec<usize>)> = Vec::new();
        let lin = |v: &mut Vec<(String, Vec<usize>)>, name: String, i: usize, o: usize| {
            v.push((format!("{name}.weight"), vec![o, i]));
            v.push((format!("{name}.bias"), vec![o]));
        };
        for (bb, bands) in [("s2_backbone", S2_BANDS), ("s1_backbone", S1_BANDS)] {
            lin(&mut v, format!("{bb}.embedding.0"), bands, d);
            lin(&mut v, format!("{bb}.embedding.2"), d, d);
            for l in 0..self.num_layers {
                let p = format!("{bb}.transformer_encoder.layers.{l}");
                v.push((format!("{p}.self_attn.in_proj_weight"), vec![3 * d, d]));
                v.push((format!("{p}.self_attn.in_proj_bias"), vec![3 * d]));
                lin(&mut v, format!("{p}.self_attn.out_proj"), d, d);
                lin(&mut v, format!("{p}.linear1"), d, f);
                lin(&mut v, format!("{p}.linear2"), f, d);
                for n in ["norm1", "norm2"] {
                    v.push((format!("{p}.{n}.weight"), vec![d]));
                    v.push((format!("{p}.{n}.bias"), vec![d]));
                }
            }
            lin(&mut v, format!("{bb}.attn_pool.query"), d, 1);
        }
        lin(&mut v, "dim_reducer.0".into(), 2 * d, 4 * d);
        v.push(("dim_reducer.1.weight".into(), vec![4 * d]));
        v.push(("dim_reducer.1.bias".into(), vec![4 * d]));
        lin(&mut v, "dim_reducer.4".into(), 4 * d, self.repr_dim);
        v
    }

    /// Multiply-adds x2 per observation token through one backbone (GEMMs plus
    /// attention scores for a sequence of `len`).
    pub fn flops_per_token(&self, bands: usize, len: usize) -> f64 {
        let d = self.d_model() as f64;
        let f = self.dim_feedforward as f64;
        let emb = 2.0 * (bands as f64 * d + d * d);
        let layer = 2.0 * (3.0 * d * d + d * d + 2.0 * d * f) + 4.0 * len as f64 * d;
        emb + self.num_layers as f64 * layer + 2.0 * d
    }

    /// Parameter count (for reports).
    pub fn param_count(&self) -> usize {
        let d = self.d_model();
        let f = self.dim_feedforward;
        let layer = 3 * d * d + 3 * d + d * d + d + d * f + f + f * d + d + 4 * d;
        let backbone = |b: usize| b * d + d + d * d + d + self.num_layers * layer + d + 1;
        let head = 2 * d * 4 * d + 4 * d + 2 * 4 * d + 4 * d * self.repr_dim + self.repr_dim;
        backbone(S2_BANDS) + backbone(S1_BANDS) + head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_param_count_matches_published() {
        assert_eq!(ModelConfig::large().param_count(), 43_831_170);
        // ~40 MFLOP per observation token.
        let f = ModelConfig::large().flops_per_token(10, 64) / 1e6;
        assert!((39.0..42.0).contains(&f), "{f}");
    }

    #[test]
    fn parses_fixture_args() {
        let v: Value = serde_json::from_str(
            r#"{"repr_dim": 128, "latent_dim": 16, "num_layers": 2, "nhead": 4, "dim_feedforward": 128, "max_seq_len": 256, "matryoshka_dims": "16,32,64,128", "enable_qk_norm": false}"#,
        )
        .unwrap();
        let c = ModelConfig::from_json(&v).unwrap();
        assert_eq!(c, ModelConfig::small());
        assert_eq!(c.d_model(), 64);
        assert!(ModelConfig::from_json(&serde_json::json!({"latent_dim": 16})).is_err());
        let mut huge = v.clone();
        huge["latent_dim"] = serde_json::json!(1u64 << 62);
        let e = ModelConfig::from_json(&huge).unwrap_err();
        assert!(e.contains("latent_dim") && e.contains("at most"), "{e}");
    }
}
