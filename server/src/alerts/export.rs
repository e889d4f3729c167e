//! The alerts as Prometheus series, for `/metrics`:
//! `flotilla_alert{alert,severity,subject} 1` per active alert, and
//! `flotilla_alerts_active{alert}` for every alert, zeros included, so a
//! rule can tell "none" from "not scraped".

use flotilla_core::api::alerts::{AlertList, AlertName};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

pub fn encode(list: &AlertList, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut family = enc.encode_descriptor(
        "flotilla_alert",
        "1 for each active alert (GET /api/v1/alerts has its sentence), by alert, severity and \
         subject (an agent, agent/kind, or server).",
        None,
        MetricType::Gauge,
    )?;
    for a in &list.alerts {
        let labels = [
            ("alert", a.alert.as_str()),
            ("severity", a.severity.as_str()),
            ("subject", a.subject.as_str()),
        ];
        family.encode_family(&labels)?.encode_gauge(&1i64)?;
    }
    let mut family = enc.encode_descriptor(
        "flotilla_alerts_active",
        "Active alerts of each kind, zeros included.",
        None,
        MetricType::Gauge,
    )?;
    for name in AlertName::ALL {
        let n = list.alerts.iter().filter(|a| a.alert == name).count() as i64;
        family
            .encode_family(&[("alert", name.as_str())])?
            .encode_gauge(&n)?;
    }
    Ok(())
}
