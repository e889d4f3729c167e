//! A bounded reader for the pickle subset `torch.save` writes.
//!
//! Every length is checked against the bytes left, objects live in one
//! arena, and nothing recurses.
//!
//! Why not candle's `pickle::Stack`: it allocates a `BINUNICODE` string's
//! declared length before reading it (a 4 GiB `vec!` from 5 bytes), clones
//! memoised objects on every `BINGET` (exponential in the input), panics on
//! short argument tuples and long `LONG1`s, and drops nested objects
//! recursively (a stack overflow from 500 KB of `TUPLE1`). Here an object is
//! an index into [`Pickle::objs`], so memory is linear in the input, and a
//! consumer walks it with [`Pickle::get`] under its own depth limit.

use std::collections::HashMap;

/// Index of an object in [`Pickle::objs`].
pub type Id = usize;

/// One unpickled object. Containers hold ids, so a memoised object is
/// shared, never copied, as in Python.
#[derive(Debug, Clone, PartialEq)]
pub enum Obj {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Tuple(Vec<Id>),
    List(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    /// `GLOBAL module\nname\n`: a class or function, never imported.
    Global {
        module: String,
        name: String,
    },
    /// `callable(*args)` (REDUCE and NEWOBJ), never called.
    Reduce {
        callable: Id,
        args: Id,
    },
    /// `obj.__setstate__(state)` (BUILD) on anything but a dict.
    Build {
        obj: Id,
        state: Id,
    },
    /// BINPERSID: torch's reference to a storage record.
    PersId(Id),
}

/// A parsed pickle: the arena and the object STOP returned.
#[derive(Debug)]
pub struct Pickle {
    pub objs: Vec<Obj>,
    pub root: Id,
}

impl Pickle {
    pub fn get(&self, id: Id) -> &Obj {
        &self.objs[id]
    }

    /// The string `id` holds, if it is one.
    pub fn str(&self, id: Id) -> Option<&str> {
        match self.get(id) {
            Obj::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The entries of the dict `id`, if it is one.
    pub fn dict(&self, id: Id) -> Option<&[(Id, Id)]> {
        match self.get(id) {
            Obj::Dict(kv) => Some(kv),
            _ => None,
        }
    }

    /// The value under the string key `key` of the dict `id`.
    pub fn dict_get(&self, id: Id, key: &str) -> Option<Id> {
        self.dict(id)?
            .iter()
            .find(|&&(k, _)| self.str(k) == Some(key))
            .map(|&(_, v)| v)
    }

    /// `id` as a non-negative integer.
    pub fn uint(&self, id: Id) -> Option<u64> {
        match self.get(id) {
            Obj::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
}

/// What sits on the machine's stack: an object, or a MARK.
#[derive(Clone, Copy)]
enum Slot {
    Mark,
    Obj(Id),
}

/// Cursor over the pickle bytes; every read is checked against what is left.
struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "at byte {}: {n} bytes declared, {} left",
                    self.at,
                    self.bytes.len() - self.at
                )
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A `\n`-terminated line (GLOBAL's module and name).
    fn line(&mut self) -> Result<String, String> {
        let rest = &self.bytes[self.at..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| format!("at byte {}: unterminated line", self.at))?;
        let line = self.take(n + 1)?;
        String::from_utf8(line[..n].to_vec())
            .map_err(|_| format!("at byte {}: a name that is not UTF-8", self.at))
    }
    fn utf8(&mut self, n: usize) -> Result<String, String> {
        let at = self.at;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| format!("at byte {at}: a string that is not UTF-8"))
    }
}

/// The machine's state: the arena, the stack and the memo.
struct Machine {
    objs: Vec<Obj>,
    stack: Vec<Slot>,
    memo: HashMap<u32, Id>,
}

impl Machine {
    fn push(&mut self, o: Obj) {
        self.objs.push(o);
        self.stack.push(Slot::Obj(self.objs.len() - 1));
    }
    fn pop(&mut self) -> Result<Id, String> {
        match self.stack.pop() {
            Some(Slot::Obj(id)) => Ok(id),
            Some(Slot::Mark) => Err("a MARK where an object was expected".into()),
            None => Err("stack underflow".into()),
        }
    }
    fn top(&self) -> Result<Id, String> {
        match self.stack.last() {
            Some(Slot::Obj(id)) => Ok(*id),
            Some(Slot::Mark) => Err("a MARK where an object was expected".into()),
            None => Err("stack underflow".into()),
        }
    }
    /// Everything above the topmost MARK, which is removed.
    fn pop_to_mark(&mut self) -> Result<Vec<Id>, String> {
        let mark = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or("no MARK on the stack")?;
        let items = self.stack.split_off(mark + 1);
        self.stack.pop();
        items
            .into_iter()
            .map(|s| match s {
                Slot::Obj(id) => Ok(id),
                Slot::Mark => Err("a MARK inside a MARK's items".to_string()),
            })
            .collect()
    }
    fn pairs(items: Vec<Id>) -> Result<Vec<(Id, Id)>, String> {
        if !items.len().is_multiple_of(2) {
            return Err("an odd number of items for a dict".into());
        }
        Ok(items.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect())
    }
    fn memo_get(&mut self, key: u32) -> Result<(), String> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| format!("memo key {key} not set"))?;
        self.stack.push(Slot::Obj(id));
        Ok(())
    }
    fn memo_put(&mut self, key: u32) -> Result<(), String> {
        let id = self.top()?;
        self.memo.insert(key, id);
        Ok(())
    }
    /// `callable(*args)`: `OrderedDict()` and `defaultdict()` become empty
    /// dicts (what torch's state_dict is), anything else stays a `Reduce`.
    fn reduce(&mut self, callable: Id, args: Id) {
        let dict = matches!(&self.objs[callable],
            Obj::Global { module, name } if module == "collections"
                && (name == "OrderedDict" || name == "defaultdict"));
        self.push(if dict {
            Obj::Dict(Vec::new())
        } else {
            Obj::Reduce { callable, args }
        });
    }
}

/// Parse a whole pickle. Every declared length is checked against the
/// bytes left before anything is allocated, so memory stays linear in
/// `bytes.len()`; the error says which byte and why.
pub fn parse(bytes: &[u8]) -> Result<Pickle, String> {
    let mut r = Input { bytes, at: 0 };
    let mut m = Machine {
        objs: Vec::new(),
        stack: Vec::new(),
        memo: HashMap::new(),
    };
    loop {
        let at = r.at;
        let op = r.u8().map_err(|_| "no STOP before the end".to_string())?;
        let step = (|| -> Result<bool, String> {
            match op {
                // PROTO, FRAME: nothing to do with the bytes they carry.
                0x80 => {
                    r.u8()?;
                }
                0x95 => {
                    r.take(8)?;
                }
                b'.' => return Ok(true),
                b'(' => m.stack.push(Slot::Mark),
                b'N' => m.push(Obj::None),
                0x88 => m.push(Obj::Bool(true)),
                0x89 => m.push(Obj::Bool(false)),
                b'K' => {
                    let v = r.u8()?;
                    m.push(Obj::Int(v.into()))
                }
                b'M' => {
                    let b = r.take(2)?;
                    m.push(Obj::Int(u16::from_le_bytes([b[0], b[1]]).into()))
                }
                b'J' => {
                    let v = r.u32()? as i32;
                    m.push(Obj::Int(v.into()))
                }
                // LONG1: a little-endian two's-complement integer of n bytes.
                0x8a => {
                    let n = r.u8()? as usize;
                    if n > 8 {
                        return Err(format!("a LONG1 of {n} bytes (at most 8)"));
                    }
                    let b = r.take(n)?;
                    let mut v = [if b.last().is_some_and(|&x| x & 0x80 != 0) {
                        0xff
                    } else {
                        0
                    }; 8];
                    v[..n].copy_from_slice(b);
                    m.push(Obj::Int(i64::from_le_bytes(v)))
                }
                // BINFLOAT is big-endian (pickletools).
                b'G' => {
                    let b = r.take(8)?;
                    let v = f64::from_be_bytes(b.try_into().expect("took 8 bytes"));
                    m.push(Obj::Float(v))
                }
                b'X' => {
                    let n = r.u32()? as usize;
                    let s = r.utf8(n)?;
                    m.push(Obj::Str(s))
                }
                0x8c => {
                    let n = r.u8()? as usize;
                    let s = r.utf8(n)?;
                    m.push(Obj::Str(s))
                }
                b'c' => {
                    let module = r.line()?;
                    let name = r.line()?;
                    m.push(Obj::Global { module, name })
                }
                b')' => m.push(Obj::Tuple(Vec::new())),
                b']' => m.push(Obj::List(Vec::new())),
                b'}' => m.push(Obj::Dict(Vec::new())),
                b't' => {
                    let items = m.pop_to_mark()?;
                    m.push(Obj::Tuple(items))
                }
                b'l' => {
                    let items = m.pop_to_mark()?;
                    m.push(Obj::List(items))
                }
                b'd' => {
                    let items = m.pop_to_mark()?;
                    m.push(Obj::Dict(Machine::pairs(items)?))
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(m.pop()?);
                    }
                    items.reverse();
                    m.push(Obj::Tuple(items))
                }
                b'a' => {
                    let v = m.pop()?;
                    let list = m.top()?;
                    match &mut m.objs[list] {
                        Obj::List(items) => items.push(v),
                        _ => return Err("APPEND to something that is not a list".into()),
                    }
                }
                b'e' => {
                    let vs = m.pop_to_mark()?;
                    let list = m.top()?;
                    match &mut m.objs[list] {
                        Obj::List(items) => items.extend(vs),
                        _ => return Err("APPENDS to something that is not a list".into()),
                    }
                }
                b's' => {
                    let v = m.pop()?;
                    let k = m.pop()?;
                    let dict = m.top()?;
                    match &mut m.objs[dict] {
                        Obj::Dict(kv) => kv.push((k, v)),
                        _ => return Err("SETITEM on something that is not a dict".into()),
                    }
                }
                b'u' => {
                    let kv = Machine::pairs(m.pop_to_mark()?)?;
                    let dict = m.top()?;
                    match &mut m.objs[dict] {
                        Obj::Dict(d) => d.extend(kv),
                        _ => return Err("SETITEMS on something that is not a dict".into()),
                    }
                }
                b'R' | 0x81 => {
                    let args = m.pop()?;
                    let callable = m.pop()?;
                    m.reduce(callable, args)
                }
                // BUILD: a dict keeps its items (torch sets `_metadata` on
                // its state_dict this way); anything else records the state.
                b'b' => {
                    let state = m.pop()?;
                    let obj = m.pop()?;
                    if matches!(m.objs[obj], Obj::Dict(_)) {
                        m.stack.push(Slot::Obj(obj));
                    } else {
                        m.push(Obj::Build { obj, state })
                    }
                }
                b'Q' => {
                    let id = m.pop()?;
                    m.push(Obj::PersId(id))
                }
                b'h' => {
                    let k = r.u8()?;
                    m.memo_get(k.into())?
                }
                b'j' => {
                    let k = r.u32()?;
                    m.memo_get(k)?
                }
                b'q' => {
                    let k = r.u8()?;
                    m.memo_put(k.into())?
                }
                b'r' => {
                    let k = r.u32()?;
                    m.memo_put(k)?
                }
                // MEMOIZE: the next free memo index.
                0x94 => {
                    let k = u32::try_from(m.memo.len()).map_err(|_| "memo full".to_string())?;
                    m.memo_put(k)?
                }
                other => return Err(format!("unsupported opcode 0x{other:02x}")),
            }
            Ok(false)
        })();
        match step {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => return Err(format!("byte {at} (opcode 0x{op:02x}): {e}")),
        }
    }
    let root = m.pop()?;
    Ok(Pickle { objs: m.objs, root })
}

/// Deepest nesting [`to_json`] follows; upstream `args` are a flat dict.
const MAX_JSON_DEPTH: usize = 32;
/// Most objects [`to_json`] visits: a shared object is expanded each time
/// it is referenced, so without this a DAG of 60 tuples would be 2^60.
const MAX_JSON_NODES: usize = 100_000;

/// `id` as JSON: numbers, strings, booleans, None, lists, tuples and dicts
/// with string keys. Dict values of any other kind become null (upstream
/// stores training options there that the encoder does not need).
pub fn to_json(p: &Pickle, id: Id) -> Result<serde_json::Value, String> {
    let mut budget = MAX_JSON_NODES;
    json_at(p, id, 0, &mut budget).map_err(|e| match e {
        JsonError::Limit(s) | JsonError::Unsupported(s) => s,
    })
}

/// A limit stops the whole conversion; an unsupported value only its dict entry.
enum JsonError {
    Limit(String),
    Unsupported(String),
}

fn json_at(
    p: &Pickle,
    id: Id,
    depth: usize,
    budget: &mut usize,
) -> Result<serde_json::Value, JsonError> {
    use serde_json::Value;
    if depth > MAX_JSON_DEPTH {
        return Err(JsonError::Limit(format!(
            "nested deeper than {MAX_JSON_DEPTH}"
        )));
    }
    *budget = budget
        .checked_sub(1)
        .ok_or_else(|| JsonError::Limit(format!("more than {MAX_JSON_NODES} values")))?;
    Ok(match p.get(id) {
        Obj::None => Value::Null,
        Obj::Bool(b) => Value::from(*b),
        Obj::Int(i) => Value::from(*i),
        Obj::Float(f) => Value::from(*f),
        Obj::Str(s) => Value::from(s.as_str()),
        Obj::Tuple(items) | Obj::List(items) => Value::Array(
            items
                .iter()
                .map(|&i| json_at(p, i, depth + 1, budget))
                .collect::<Result<_, _>>()?,
        ),
        Obj::Dict(kv) => {
            let mut m = serde_json::Map::new();
            for &(k, v) in kv {
                let k = p.str(k).ok_or_else(|| {
                    JsonError::Unsupported("a dict key that is not a string".into())
                })?;
                let v = match json_at(p, v, depth + 1, budget) {
                    Ok(v) => v,
                    Err(JsonError::Unsupported(_)) => Value::Null,
                    Err(e) => return Err(e),
                };
                m.insert(k.to_string(), v);
            }
            Value::Object(m)
        }
        other => {
            return Err(JsonError::Unsupported(format!(
                "unsupported value {}",
                kind(other)
            )))
        }
    })
}

/// A short name for an object's kind, for errors (never its contents).
pub fn kind(o: &Obj) -> &'static str {
    match o {
        Obj::None => "None",
        Obj::Bool(_) => "bool",
        Obj::Int(_) => "int",
        Obj::Float(_) => "float",
        Obj::Str(_) => "str",
        Obj::Tuple(_) => "tuple",
        Obj::List(_) => "list",
        Obj::Dict(_) => "dict",
        Obj::Global { .. } => "global",
        Obj::Reduce { .. } => "reduce",
        Obj::Build { .. } => "build",
        Obj::PersId(_) => "persistent id",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_past_the_end_are_errors_not_allocations() {
        let mut b = vec![0x80, 2, b'X'];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        let e = parse(&b).unwrap_err();
        assert!(e.contains("declared"), "{e}");
    }

    #[test]
    fn shared_objects_are_not_copied_and_json_is_bounded() {
        // t0 = (); t_{i+1} = (t_i, t_i), 64 times: 2^64 leaves if expanded.
        let mut b = vec![0x80, 2, b')', b'q', 0];
        for i in 0..64u8 {
            b.extend_from_slice(&[b'h', i, b'h', i, 0x86, b'q', i + 1]);
        }
        b.push(b'.');
        let p = parse(&b).unwrap();
        assert!(p.objs.len() < 200);
        let e = to_json(&p, p.root).unwrap_err();
        assert!(e.contains("nested") || e.contains("values"), "{e}");
    }

    #[test]
    fn long1_sign_extends_and_is_capped() {
        let p = parse(&[0x8a, 2, 0xfe, 0xff, b'.']).unwrap();
        assert_eq!(p.get(p.root), &Obj::Int(-2));
        assert!(parse(&[0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, b'.']).is_err());
    }
}
