// The demo's own business data: a payments table in PostgreSQL (npm `pg`),
// written with the fencing token of the attempt that owns the key, or, with
// DEMO_IDEMPOTENCY=off, with neither key nor token (both NULL: the gateway in
// front keeps the key in its record, and there is no attempt to fence).
'use strict';

const {Pool} = require('pg');

// Converts a libpq conninfo ("host=127.0.0.1 port=5432 user=postgres
// dbname=postgres", values optionally in single quotes) into a `pg` config
// object; a postgres:// or postgresql:// URI is passed through as is.
function pgConfig(conninfo) {
  if (/^postgres(ql)?:\/\//.test(conninfo)) return {connectionString: conninfo};
  const names = {
    host: 'host', hostaddr: 'host', port: 'port', user: 'user', password: 'password',
    dbname: 'database', application_name: 'application_name',
  };
  const config = {};
  // key = value | key = 'quoted \' value'
  const pair = /\s*([a-z_]+)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|([^\s']*))/y;
  for (let pos = 0; conninfo.slice(pos).trim() !== ''; pos = pair.lastIndex) {
    pair.lastIndex = pos;
    const match = pair.exec(conninfo);
    if (match === null) throw new Error(`DEMO_POSTGRES: cannot parse "${conninfo}"`);
    const [, key, quoted, bare] = match;
    const value = quoted !== undefined ? quoted.replace(/\\(.)/g, '$1') : bare;
    if (key === 'connect_timeout') {
      config.connectionTimeoutMillis = Number(value) * 1000;
    } else if (key === 'sslmode') {
      // `pg` cannot "prefer" TLS: only the modes that demand it turn it on.
      if (['require', 'verify-ca', 'verify-full'].includes(value)) {
        config.ssl = {rejectUnauthorized: value !== 'require'};
      }
    } else if (names[key]) {
      config[names[key]] = key === 'port' ? Number(value) : value;
    } else {
      throw new Error(`DEMO_POSTGRES: unsupported conninfo keyword "${key}"`);
    }
  }
  return config;
}

const SCHEMA = `
  CREATE TABLE IF NOT EXISTS payments (
    payment_id text PRIMARY KEY,
    idempotency_key text UNIQUE,
    amount_minor bigint NOT NULL CHECK (amount_minor > 0),
    currency text NOT NULL,
    payee text NOT NULL,
    fencing_token bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((idempotency_key IS NULL) = (fencing_token IS NULL))
  )`;

// Opens the pool and creates the table if absent (under an advisory lock, so
// that demo instances starting together do not race on CREATE TABLE).
async function open(conninfo) {
  const pool = new Pool({...pgConfig(conninfo), max: 10});
  // An idle connection that breaks (e.g. a PostgreSQL restart) is dropped
  // from the pool; without a listener the error would end the process.
  pool.on('error', (err) => console.error(`idle PostgreSQL connection: ${err.message}`));
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query("SELECT pg_advisory_xact_lock(hashtext('payments-demo schema'))");
    await client.query(SCHEMA);
    await client.query('COMMIT');
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
  return pool;
}

// Writes the payment of `key` with `fencingToken`. One row per key: a newer
// attempt (higher token; one whose predecessor failed retryably or lost its
// lease under the `release` policy) replaces the row of an older one, and a
// stale attempt (lower or equal token than the stored one) changes nothing.
// Returns true iff this attempt's row is stored.
async function writePayment(pool, key, payment, fencingToken) {
  const result = await pool.query(
      `INSERT INTO payments AS p
           (idempotency_key, payment_id, amount_minor, currency, payee, fencing_token)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (idempotency_key) DO UPDATE
           SET payment_id = EXCLUDED.payment_id, amount_minor = EXCLUDED.amount_minor,
               currency = EXCLUDED.currency, payee = EXCLUDED.payee,
               fencing_token = EXCLUDED.fencing_token, created_at = now()
           WHERE p.fencing_token < EXCLUDED.fencing_token
         RETURNING payment_id`,
      [key, payment.payment_id, payment.amount_minor, payment.currency, payment.payee,
       fencingToken]);
  return result.rowCount === 1;
}

// Fails unless the payments table takes rows without a key: a table created
// by a demo older than DEMO_IDEMPOTENCY=off has idempotency_key as its
// primary key, which CREATE TABLE IF NOT EXISTS leaves as it is.
async function checkKeyless(pool) {
  const result = await pool.query(
      `SELECT is_nullable FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name = 'payments'
          AND column_name = 'idempotency_key'`);
  if (result.rowCount !== 1 || result.rows[0].is_nullable !== 'YES') {
    throw new Error('the payments table was created by an older demo (idempotency_key ' +
        'NOT NULL): drop it or point DEMO_POSTGRES at another database');
  }
}

// Inserts a payment made without idempotency (DEMO_IDEMPOTENCY=off): a new row
// every time, with NULL idempotency_key and fencing_token.
async function insertPayment(pool, payment) {
  await pool.query(
      `INSERT INTO payments (payment_id, amount_minor, currency, payee)
         VALUES ($1, $2, $3, $4)`,
      [payment.payment_id, payment.amount_minor, payment.currency, payment.payee]);
}

// The stored payment of `key` ({payment_id, amount_minor, currency, payee,
// fencing_token}, numbers as numbers), or null when there is none.
async function findPayment(pool, key) {
  const result = await pool.query(
      `SELECT payment_id, amount_minor, currency, payee, fencing_token
         FROM payments WHERE idempotency_key = $1`,
      [key]);
  if (result.rowCount === 0) return null;
  const row = result.rows[0];
  // bigint columns arrive as strings; both are validated safe integers.
  return {...row, amount_minor: Number(row.amount_minor),
          fencing_token: Number(row.fencing_token)};
}

module.exports = {checkKeyless, findPayment, insertPayment, open, pgConfig, writePayment};
